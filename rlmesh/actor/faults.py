"""Built-in fault injection: SIGKILL or hang procs of a mesh on a schedule, to prove a program survives.

    with rm.actor.faults.FaultInjector(generators, kind="kill", every_s=15, seed=1):
        run_training()

Each injection is a ``fault_injected`` lifecycle event (telemetry's ``actors``
table), followed by the ``died`` the supervisor detects: by exit for ``kill``, by
heartbeat timeout for ``hang`` (the proc stops heartbeating and stops serving,
like a proc stuck in a C call). Victims are drawn with a seeded RNG among the
target's procs that are alive at that moment.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Any, Optional

from rlmesh.actor.controller import Controller
from rlmesh.actor.proc_state import ProcState
from rlmesh.errors import ConfigError

logger = logging.getLogger(__name__)


KINDS = ("kill", "hang")


@dataclass
class FaultConfig:
    """The ``faults=`` settings of a recipe: ``faults.kill=generator faults.every_s=15 faults.seed=1``.

    Set one of ``kill`` (SIGKILL) or ``hang`` (the proc's heartbeat thread stops and it stops
    serving, like a proc stuck in a C call) to the role whose procs to hit; the recipe maps
    roles (``generator``, ``trainer``, ``reward``) to its meshes.
    """

    kill: Optional[str] = None
    """Role whose procs are SIGKILLed on the schedule (null: none)."""
    hang: Optional[str] = None
    """Role whose procs are hung on the schedule (null: none)."""
    every_s: float = 20.0
    """Seconds between injections (the first comes after ``start_after_s``)."""
    start_after_s: Optional[float] = None
    """Delay before the first injection; defaults to ``every_s``."""
    max_faults: int = -1
    """Stop after this many injections; -1 = no limit."""
    seed: int = 0
    """RNG seed for choosing victims."""

    def __post_init__(self) -> None:
        if self.kill and self.hang:
            raise ConfigError(f"faults.kill={self.kill!r} and faults.hang={self.hang!r}: set one of them (one "
                              "schedule per run), the other to null")
        if self.every_s <= 0:
            raise ConfigError(f"faults.every_s={self.every_s!r}: use a positive number of seconds")
        if self.start_after_s is not None and self.start_after_s < 0:
            raise ConfigError(f"faults.start_after_s={self.start_after_s!r}: use 0 or more seconds (or null)")
        if self.max_faults < -1 or self.max_faults == 0:
            raise ConfigError(f"faults.max_faults={self.max_faults!r}: use -1 (no limit) or 1 or more")

    @property
    def kind(self) -> str:
        """``kill``, ``hang`` or ``none``."""
        return "kill" if self.kill else "hang" if self.hang else "none"

    @property
    def target(self) -> str | None:
        """The role to hit (``None`` when no faults are configured)."""
        return self.kill or self.hang

    def check_roles(self, roles: Any) -> None:
        """Raise a :class:`ConfigError` naming the key when the target is not one of ``roles``."""
        if self.target is not None and self.target not in roles:
            raise ConfigError(f"faults.{self.kind}={self.target!r} is not a role of this recipe: use one of "
                              f"{', '.join(sorted(roles))}")


def _proc_ids(target: Any) -> list[str]:
    """Proc ids behind a ProcMesh or an ActorMesh (in rank order, without duplicates)."""
    if hasattr(target, "_proc_ids") and hasattr(target, "_shape"):  # ProcMesh
        return [target._proc_ids[i] for i in target._shape.indices]
    if hasattr(target, "_points"):  # ActorMesh
        return list(dict.fromkeys(target._point(r).proc_id for r in range(len(target))))
    raise TypeError(f"FaultInjector targets a ProcMesh or an ActorMesh, not {type(target).__name__}")


RETRY_S = 0.2
"""Seconds before a turn that found no live target tries again."""


class FaultInjector:
    """A background thread that injects ``kind`` faults into ``target``'s procs every ``every_s`` seconds."""

    def __init__(self, target: Any, kind: str = "kill", every_s: float = 20.0, seed: int = 0,
                 max_faults: int = -1, start_after_s: float | None = None):
        if kind not in KINDS + ("none",):
            raise ValueError(f"fault kind {kind!r}: use kill, hang or none")
        if every_s <= 0:
            raise ValueError(f"every_s={every_s!r} must be > 0 seconds")
        self.proc_ids = _proc_ids(target)
        self.kind = kind
        self.every_s = every_s
        self.start_after_s = every_s if start_after_s is None else start_after_s
        self.max_faults = max_faults
        self.rng = random.Random(seed)
        self.injected: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlmesh-faults", daemon=True)

    @classmethod
    def from_config(cls, cfg: FaultConfig, roles: dict[str, Any]) -> "FaultInjector":
        """The injector ``cfg`` describes, aimed at ``roles[cfg.target]`` (a no-op one when ``cfg`` sets none)."""
        cfg.check_roles(roles)
        target = roles[cfg.target] if cfg.target else next(iter(roles.values()))
        return cls(target, cfg.kind, cfg.every_s, cfg.seed, cfg.max_faults, cfg.start_after_s)

    def start(self) -> "FaultInjector":
        if self.kind != "none":
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def __enter__(self) -> "FaultInjector":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _run(self) -> None:
        controller = Controller.get()
        wait = self.start_after_s
        while not self._stop.wait(wait):
            # a turn with no live target (all starting or restarting, as on a busy host) is retried soon, not a
            # whole period later: a short run would otherwise end before its first fault
            wait = min(self.every_s, RETRY_S)
            alive = [p for p in self.proc_ids if controller.procs.get(p) and controller.procs[p].state == ProcState.ALIVE]
            if not alive:
                continue
            victim = self.rng.choice(alive)
            if controller.inject_fault(victim, self.kind):
                self.injected.append(victim)
                logger.warning("fault injection: %s %s (%d so far)", self.kind, victim, len(self.injected))
                wait = self.every_s
            if 0 <= self.max_faults <= len(self.injected):
                return
