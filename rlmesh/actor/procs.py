"""What the controller and its launchers exchange, and what it keeps per proc.

A launcher (local processes, Kubernetes pods) gets a :class:`LaunchRequest` and returns a
:class:`ProcHandle`; the controller keeps one :class:`ProcRecord` per proc across its
incarnations (state, restarts, heartbeat history, the actors to re-create in a replacement).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlmesh import settings
from rlmesh.actor.supervision import FailureDetection, HeartbeatMonitor, Restart
from rlmesh.errors import ActorDied

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a launcher needs to start one worker proc."""

    controller_addr: str
    proc_id: str
    proc_mesh: str
    rank: int
    incarnation: int
    env: dict[str, str]
    restartable: bool = False  # the mesh's Restart policy allows restarts (local launcher: keep a warm template)


class ProcHandle(Protocol):
    """A launched proc as its launcher sees it (a child process, a pod...)."""

    pid: int | None

    def poll(self) -> tuple[int | None, int | None] | tuple[int | None, int | None, str] | None:
        """``None`` while running, else ``(exit_code, signal)`` or ``(exit_code, signal, reason)``.

        Called on the supervisor thread every tick (50 ms): it must not block; a
        launcher that learns about exits asynchronously (a pod watch) caches them.
        """

    def kill(self) -> None:
        """Make sure the proc is gone (SIGKILL, pod deletion). Must not block."""


class Launcher(Protocol):
    """Optional extras, looked up with ``getattr``: ``preload(proc_mesh, modules)`` (the modules the mesh's
    actor classes live in), ``release(proc_mesh)`` (the mesh is gone) and ``close()`` (the controller is)."""

    def launch(self, req: LaunchRequest) -> ProcHandle: ...


def call_launchers(launchers: Any, method: str, *args: Any) -> None:
    """Call an optional launcher method once per distinct launcher; errors are logged, never raised."""
    for launcher in {id(x): x for x in launchers}.values():
        fn = getattr(launcher, method, None)
        if fn is None:
            continue
        try:
            fn(*args)
        except Exception:  # noqa: BLE001
            logger.warning("launcher %s(%s) failed", method, ", ".join(map(repr, args)), exc_info=True)


@dataclass
class ProcRecord:
    proc_id: str
    proc_mesh: str
    rank: int
    launcher: Launcher
    policy: Restart
    env: dict[str, str]
    incarnation: int = 0
    handle: ProcHandle | None = None
    state: str = "starting"  # starting | rejoining | alive | restarting | stopping | dead | failed | stopped
    pid: int | None = None
    host: str = ""
    addr: str = ""
    last_hb: float = 0.0
    board_slot: int | None = None  # its slot of the heartbeat board (procs on the controller's host)
    last_ack: float = 0.0  # when the supervisor last answered its heartbeat (acks are sent at most once a second)
    started_at: float = 0.0
    restarts_used: int = 0
    restart_at: float = 0.0
    stop_deadline: float = 0.0
    actors: list[tuple[dict, list[Any]]] = field(default_factory=list)
    ready: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    rejoin_pending: int = 0
    detect: FailureDetection = field(default_factory=FailureDetection)
    start_timeout: float = settings.START_TIMEOUT_S.default
    spawns_pending: int = 0  # actor __init__ calls in flight: heartbeats may pause (imports hold the GIL)
    down_at: float | None = None  # wall time of the injected fault or, failing that, the death; cleared when serving
    recovering: tuple[float, float] | None = None  # serving again, no progress yet: (down_at, serving_s)
    restart_times: deque = field(default_factory=deque)  # monotonic times of its restarts (the intensity window)
    hb: HeartbeatMonitor = field(default_factory=HeartbeatMonitor)
    joined: bool = False  # some incarnation has joined (a proc that never did and exits by itself is not retried)
    awaiting: list = field(default_factory=list)  # first-time spawns whose proc died: done when a replacement serves
    deferred: list = field(default_factory=list)  # first-time spawns to send once the proc is alive again
    gave_up_reason: str = ""

    @property
    def ident(self) -> bytes:
        return f"{self.proc_id}#{self.incarnation}".encode()

    def fail_waiters(self, why: str, exit_code: int | None = None, sig: int | None = None) -> None:
        """The proc will not come back: whoever waits for it to start or to create actors learns why."""
        if not self.ready.done():
            self.ready.set_exception(ActorDied(
                f"proc {self.proc_id} ended before it joined ({why}); its stderr above says why",
                mesh=self.proc_mesh, rank=self.rank, endpoint="(start)", exit_code=exit_code, signal=sig))
        waiting = self.awaiting + [fut for _, _, fut in self.deferred]
        self.awaiting, self.deferred = [], []
        for fut in waiting:
            if not fut.done():
                spec = fut._rlmesh_specs[0]
                fut.set_exception(ActorDied(f"proc {self.proc_id} died while creating {spec['mesh']}[{spec['rank']}] "
                                            f"and will not be replaced: {why}", mesh=spec["mesh"], rank=spec["rank"],
                                            endpoint="__init__", exit_code=exit_code, signal=sig))

    def actor_ids(self) -> tuple[str, ...]:
        return tuple(spec["actor_id"] for spec, _ in self.actors)
