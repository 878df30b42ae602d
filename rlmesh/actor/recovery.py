"""What the controller does when a proc ends: the restart policy, the relaunch, and the rejoin.

Why a module of its own: this is the path every fault-tolerance guarantee rests on (a death
fails or re-homes every future waiting on the proc, the :class:`Restart` policy decides on a
replacement, and the replacement gets its actors re-created from their constructor arguments
before it counts as alive), and it reads best on its own, away from the socket loop and the
launch code of :mod:`rlmesh.actor.controller`. It is a mixin: the methods run on the
supervisor thread, on the controller's state, like the rest of the controller.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Callable

from rlmesh.actor.client import Client
from rlmesh.actor.proc_state import ProcState
from rlmesh.actor.procs import ProcRecord

logger = logging.getLogger("rlmesh.actor.controller")  # the controller's log, as before the split


class RecoveryMixin:
    """The exit and restart half of :class:`~rlmesh.actor.controller.Controller`."""

    # the controller's, used here
    client: Client
    by_ident: dict[bytes, ProcRecord]
    procs: dict[str, ProcRecord]
    _spawn_waits: dict[int, tuple[ProcRecord, concurrent.futures.Future]]
    _ups: list
    _announce_ups: Callable[[], None]
    _downs: list
    _emit: Callable[..., None]
    _launch: Callable[[ProcRecord], None]
    _mark_alive: Callable[[ProcRecord], None]
    _send_spawn: Callable[..., None]
    submit: Callable[[Callable[[], Any]], concurrent.futures.Future]

    def _on_exit(self, rec: ProcRecord, exit_code: int | None, sig: int | None, reason: str) -> None:
        stopping = rec.state == ProcState.STOPPING
        rec.recovering = None  # a replacement that died before it made progress never recovered
        rec.state = ProcState.STOPPED if stopping else ProcState.DEAD
        if not stopping and rec.down_at is None:
            rec.down_at = time.time()
        why = reason or ("clean exit" if exit_code == 0 else "")
        # The event goes out first, so a caller woken by ActorDied already finds the death recorded.
        self._emit("stopped" if stopping else "died", rec, exit_code=exit_code, signal=sig, reason=why)
        self.client.proc_down(rec.proc_id, rec.incarnation, exit_code, sig, why)
        if self._ups:
            self._announce_ups()  # an up still queued must not arrive after this down
        # Told to the others at the end of this supervisor turn, with every other death of the turn
        # in the same message: procs stopped together (a host lost, a mesh stopped) cost one message
        # per survivor, not one per death per survivor (O(N^2) at N procs).
        self._downs.append((rec.proc_id, rec.incarnation, exit_code, sig, why))
        for req, (r, fut) in list(self._spawn_waits.items()):
            if r is rec:
                del self._spawn_waits[req]
                if getattr(fut, "_rlmesh_first", False):
                    rec.awaiting.append(fut)  # the replacement re-creates it (or fail_waiters below says why not)
                    continue
                spec = fut._rlmesh_specs[0]  # type: ignore[attr-defined]  # set by Controller.spawn_actors, for messages
                fut.set_exception(Client._died(spec["mesh"], spec["rank"], "__init__", exit_code, sig, why))
        rec.spawns_pending = 0
        rec.awaiting.extend(fut for _, _, fut in rec.deferred)  # they are in rec.actors: the rejoin makes them
        rec.deferred = []
        how = f"signal {sig}" if sig is not None else f"exit code {exit_code}" if exit_code is not None else why
        if stopping:
            rec.fail_waiters(f"stopped ({how})", exit_code, sig)
            return
        now = time.monotonic()
        if not rec.joined and sig is None:
            # It never joined and ended by itself (an import error, a bad interpreter) or by the start
            # timeout: a restart would do the same again. Killed by a signal, it is retried below.
            rec.state = "failed"
            rec.fail_waiters(how, exit_code, sig)
        elif rec.policy.allows(rec.restart_times, now):
            rec.restarts_used += 1
            rec.restart_times.append(now)
            while rec.policy.within_s is not None and now - rec.restart_times[0] >= rec.policy.within_s:
                rec.restart_times.popleft()
            rec.state = "restarting"
            rec.restart_at = now + rec.policy.backoff_s
        else:
            rec.state = "failed"
            rec.gave_up_reason = f"{rec.policy.describe()} used up"
            if rec.policy.max_restarts:
                self._emit("gave_up", rec, exit_code=exit_code, signal=sig,
                           reason=f"max_restarts={rec.policy.max_restarts} exhausted ({rec.gave_up_reason})")
            rec.fail_waiters(f"{how}; {rec.gave_up_reason or 'restarts are off'}", exit_code, sig)

    def _relaunch(self, rec: ProcRecord) -> None:
        self.by_ident.pop(rec.ident, None)
        rec.incarnation += 1
        rec.state = ProcState.STARTING
        rec.addr = ""
        self._launch(rec)


    def _progressed(self, proc_ids: list[str], what: str, at: float) -> None:
        """``proc_ids`` made progress at wall time ``at`` (:meth:`Controller.progressed`): a ``recovered``
        event for each that is serving again after a fault and had made none since."""
        for proc_id in proc_ids:
            rec = self.procs.get(proc_id)
            if rec is None or rec.recovering is None or rec.state != ProcState.ALIVE:
                continue
            since, serving = rec.recovering
            rec.recovering = None
            self._emit("recovered", rec, serving_s=serving, recovery_s=at - since, reason=what, ts=at)

    def _rejoin(self, rec: ProcRecord) -> None:
        """A replacement proc joined: re-create its actors (``__init__`` then ``on_restart``)."""
        rec.state = ProcState.REJOINING
        rec.rejoin_pending = len(rec.actors)
        if not rec.actors:
            self._restarted(rec)
            return
        for spec, cls_payload in rec.actors:
            fut: concurrent.futures.Future = concurrent.futures.Future()
            fut.add_done_callback(lambda f, rec=rec, inc=rec.incarnation: self.submit(  # type: ignore[misc]  # a lambda with a default argument (binds the loop's value): mypy cannot infer it
                lambda: self._rejoined_one(rec, inc, f)))
            self._send_spawn(rec, [spec], cls_payload, True, fut)

    def _rejoined_one(self, rec: ProcRecord, inc: int, f: concurrent.futures.Future) -> None:
        if rec.incarnation != inc or rec.state != ProcState.REJOINING:
            return
        exc = f.exception()
        if exc is not None:
            logger.error("re-creating actors on %s failed: %s", rec.proc_id, exc)
            if rec.handle is not None:
                rec.handle.kill()
            return  # the tick sees the exit and applies the restart policy again
        rec.rejoin_pending -= 1
        if rec.rejoin_pending == 0:
            self._restarted(rec)

    def _restarted(self, rec: ProcRecord) -> None:
        self._mark_alive(rec)
        took = None if rec.down_at is None else time.time() - rec.down_at
        rec.recovering = None if rec.down_at is None or took is None else (rec.down_at, took)
        rec.down_at = None
        self._emit("restarted", rec, serving_s=took)
        if not rec.ready.done():  # killed before it first joined: the launch waits for this one
            rec.ready.set_result(rec)
        for fut in rec.awaiting:  # first-time spawns its predecessor died in: the rejoin created them
            if not fut.done():
                fut.set_result(True)
        rec.awaiting.clear()
        deferred, rec.deferred = rec.deferred, []
        for spec, cls_payload, fut in deferred:
            self._send_spawn(rec, [spec], cls_payload, False, fut, first=True)
