"""Keeping a recipe's run going through proc failures: what its controller loop does when a
call fails, and the account of every work item it issued.

Why here and not in each recipe: PPO and GRPO (and any user's recipe) need the same three
things, and each is easy to get subtly wrong in a loop:

- **A replica loop that survives its proc** (:func:`serve_work`): a generator call that
  fails with ``ActorDied`` (SIGKILL, a hang caught by heartbeat) or ``CallTimeout`` puts the
  item back with the same id for whichever replica is free next, waits for its own proc's
  replacement, and carries on. The other replicas never pause.
- **Waiting for a replacement** (:meth:`Recovery.wait_back`), and turning "the supervisor
  gave up" (``max_restarts`` exhausted) into :class:`RunFailed`, one message naming the
  mesh, the rank and the last error.
- **The ledger** (:class:`WorkLedger`): one ``work_items`` telemetry row per transition of
  every issued id, so a run's SQL can prove nothing was lost or counted twice
  (``docs/faults.md``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

import rlmesh as rm
from rlmesh.actor.controller import Controller
from rlmesh.actor.proc_state import ProcState
from rlmesh.errors import RlmeshError
from rlmesh.rl.run.placement import call_trainer
from rlmesh.rl.train.recovery import peer_lost
from rlmesh.rl.run.report import TERMINAL_SQL
from rlmesh.rl.results import TrainResult
from rlmesh.rl.run.schedule import AsyncWorkScheduler, WorkItem

logger = logging.getLogger(__name__)



class RunFailed(RlmeshError):
    """A recipe run stopped because a proc failed for good (its restarts were used up)."""

    def __init__(self, message: str, mesh: str = "", rank: int = -1, last_error: str = "",
                 checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.mesh, self.rank, self.last_error, self.checkpoint = mesh, rank, last_error, checkpoint


def short_error(exc: BaseException) -> str:
    """First line of an error, for reasons in telemetry rows and messages."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class WorkLedger:
    """The scheduler's event callback: every transition of a work id becomes a ``work_items`` row.

    ``attempt`` counts re-issues of the id so far; ``generation`` tells a resumed run's
    controller apart from the one before it (0 for the first controller, +1 per resume).
    """

    def __init__(self, generation: int = 0) -> None:
        self.generation = generation
        self.attempts: dict[str, int] = {}

    def __call__(self, event: str, work_id: str, reason: str) -> None:
        if event == "reissued":
            self.attempts[work_id] = self.attempts.get(work_id, 0) + 1
        rm.telemetry.record("work_items", work_id=work_id, event=event, reason=reason or None,
                            attempt=self.attempts.get(work_id, 0), generation=self.generation)

    def close_out(self, work: AsyncWorkScheduler, why: str = "the run ended before a train step used it") -> int:
        """End-of-run: ids still holding credit (generated or running, never trained on) are ``unused``."""
        left = work.in_flight()
        for wid in left:
            self("unused", wid, why)
        return len(left)


def abandon_previous(query: Callable[[str], Any], ledger: WorkLedger) -> int:
    """A resumed run: ids the dead controller issued and never closed are ``abandoned`` (their
    generators and the buffer died with it). Returns how many."""
    rows = query(f"SELECT work_id FROM work_items GROUP BY work_id HAVING bool_or(event = 'issued') "
                 f"AND count(*) FILTER (WHERE event IN ({TERMINAL_SQL})) = 0 ORDER BY work_id").to_pylist()
    for r in rows:
        ledger("abandoned", r["work_id"], "the controller died; a resumed run starts with a fresh buffer")
    return len(rows)


class Recovery:
    """Waits for the replacement of a failed proc, or raises :class:`RunFailed` when there will be none;
    :meth:`train` is the recipes' train call with that recovery and the work accounting around it.

    ``timeout_s`` bounds one wait (a replacement that never joins is a failure too).
    """

    def __init__(self, timeout_s: float = 120.0, poll_s: float = 0.02, meshes: dict[str, Any] | None = None) -> None:
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.unsettled = False
        """A trainer died since the last train call that answered: its answer (the batch it trained, the
        rollouts the buffer dropped as it sampled) may be lost; the next answer is followed by :meth:`settle`."""
        self.meshes = dict(meshes or {})
        """Actor meshes by name: an ``ActorDied`` names the mesh that died, which may be a peer of
        the callee (the buffer dying under a generator's ``add``)."""

    def died(self, exc: BaseException, callee: Any) -> Any:
        """The mesh whose proc ``exc`` reports dead: ``callee`` itself, or the peer it names."""
        name = getattr(exc, "mesh", "")
        if not name or name == getattr(callee, "_name", None):
            return callee
        return self.meshes.get(name, callee)

    @staticmethod
    def progressed(meshes: list[Any], what: str) -> None:
        """The procs behind ``meshes`` made progress (``what``): each one serving again after a fault
        gets its ``recovered`` row now (:meth:`Controller.progressed`); the rest cost a lookup each."""
        Controller.get().progressed([p for m in meshes for p in m.proc_ids], what)

    @staticmethod
    def _records(mesh: Any) -> list[Any]:
        procs = Controller.get().procs
        ids = dict.fromkeys(mesh._point(r).proc_id for r in range(len(mesh)))
        return [procs[p] for p in ids if p in procs]

    async def wait_back(self, mesh: Any, error: BaseException, role: str) -> None:
        """After ``error`` from ``mesh`` (one replica or the trainer): return once every proc behind
        it serves again; raise :class:`RunFailed` if the supervisor gave up on one."""
        await self._wait_procs(mesh, role, error, lambda recs: all(r.state == ProcState.ALIVE for r in recs),
                               "no replacement serving")

    async def wait_replaced(self, mesh: Any, before: list[int], error: BaseException) -> None:
        """Wait until every proc of ``mesh`` runs a newer incarnation than ``before`` (in rank order) and
        serves; :class:`RunFailed` when the supervisor gave up on one or none came within ``timeout_s``."""
        await self._wait_procs(
            mesh, "trainer", error,
            lambda recs: all(r.incarnation > b and r.state == ProcState.ALIVE for r, b in zip(recs, before)),
            "not every rank replaced")

    async def _wait_procs(self, mesh: Any, role: str, error: BaseException, ready: Callable[[list[Any]], bool],
                          missing: str) -> None:
        """Poll ``mesh``'s proc records until ``ready(records)``; :class:`RunFailed` when the supervisor
        gave up on one, or ``missing`` (what never came) after ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            recs = self._records(mesh)
            bad = next((r for r in recs if r.state in (ProcState.FAILED, ProcState.STOPPED)), None)
            if bad is not None:
                raise self.failed(role, bad, error)
            if ready(recs):
                return
            if time.monotonic() > deadline:
                raise RunFailed(f"{role} {mesh._name}: {missing} {self.timeout_s:.0f} s after "
                                f"{short_error(error)} (run.recovery_timeout_s)", mesh=mesh._name,
                                last_error=short_error(error))
            await asyncio.sleep(self.poll_s)

    async def recover(self, exc: BaseException, callee: Any, role: str) -> Any:
        """After ``exc`` (an ``ActorDied``) from a call to ``callee``: wait until the mesh that died
        (``callee`` itself, or the peer the error names) serves again; returns that mesh."""
        dead = self.died(exc, callee)
        await self.wait_back(dead, exc, role if dead is callee else str(getattr(exc, "mesh", role)))
        return dead

    async def call_surviving(self, mesh: Any, role: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()`` until it returns: after each ``ActorDied`` wait for the dead mesh's replacement
        and call again. For idempotent calls the loop cannot go on without (the trainer's state at
        the start): a proc killed just as the run begins is a restart, not a failed run. Raises
        :class:`RunFailed` once the supervisor gives up on the proc (its restarts are used up)."""
        while True:
            try:
                return await call()
            except rm.ActorDied as exc:
                logger.warning("%s: %s; calling again once it serves", role, short_error(exc))
                await self.recover(exc, mesh, role)

    async def train(self, trainer: Any, buffer: Any, work: AsyncWorkScheduler, batch_size: int,
                    timeout_s: float, collect: tuple[Any, int] | None = None) -> TrainResult | None:
        """One ``trainer.train`` call with its result accounted in ``work``: the result when a step
        was trained, else ``None`` (not enough fresh rollouts yet, or a failure recovered from).
        With ``collect`` (a generator config and a sample count) the call is
        ``trainer.collect_and_train(*collect)`` instead (the trainer collects its own rollouts:
        ``generator.in_trainer``), recovered from the same way.

        On ``ActorDied`` the trainer died (its replacement reloads its newest checkpoint; wait for
        it) or the buffer under it did (wait for the buffer, then free the credit of every item
        the dead one held, minus what the replacement already has).
        """
        before = [r.incarnation for r in self._records(trainer)] if len(trainer) > 1 else None
        try:
            if collect is not None:
                m = await call_trainer(trainer, "collect_and_train", *collect)
            elif self.unsettled:
                m = await self._train_settling(trainer, buffer, work, batch_size, timeout_s)
            else:
                m = await call_trainer(trainer, "train", batch_size, timeout_s)
        except rm.ActorDied as exc:
            dead = self.died(exc, trainer)
            self.unsettled = self.unsettled or dead is trainer
            await self.wait_back(dead, exc, "trainer" if dead is trainer else "buffer")
            if dead is trainer:  # free now the credit of what the dead one's sample dropped: fresh work flows
                await self.settle(buffer, work, work.version)
            else:
                # killed again while asked: wait for the next one and ask it
                held = await self.call_surviving(buffer, "buffer", buffer.holding.call_one)
                work.lost_with_buffer("the buffer's proc died with it", held)
            return None
        except rm.ActorError as exc:
            if before is None or not peer_lost(exc):
                raise
            # a rank's collective failed as its peer died, before the supervisor reaped the dead proc:
            # every rank restarts (rlmesh.rl.train.recovery); wait for all of them to be replaced
            self.unsettled = True
            await self.wait_replaced(trainer, before, exc)
            await self.settle(buffer, work, work.version)
            return None
        work.requeued(m.requeued)
        work.rejected(m.dropped, m.drop_reasons)  # stale inside the buffer: their credit is free
        if m.trained:
            work.consumed(m.rollout_ids, m.policy_version)
            self.progressed([trainer, buffer], "train step")  # the buffer sampled it, the trainer trained it
        if self.unsettled:  # the replacement's first sample forgot the leases its checkpoint covers
            await self.settle(buffer, work, m.policy_version)
            self.unsettled = False
        return m if m.trained else None

    SETTLE_POLL_S = 0.5
    """How often the buffer is asked where a dead trainer's items went while its replacement's first
    ``train`` call waits (:meth:`_train_settling`)."""

    async def _train_settling(self, trainer: Any, buffer: Any, work: AsyncWorkScheduler, batch_size: int,
                              timeout_s: float) -> TrainResult:
        """The first ``train`` call to a restarted trainer, settling with the buffer while it waits.

        Why: the replacement's first ``sample`` settles its leases (what its checkpoint covers is
        ``trained`` from then on) and then waits for fresh rollouts. The generation credit of those
        items is freed only once the controller hears of them, so until then it issues no new work,
        no rollout comes, and the sample waits out its whole timeout (``run.train_timeout_s``: a
        120 s stall after a trainer-mesh restart, seen in the chaos tests on a busy host). Asking the
        buffer every :attr:`SETTLE_POLL_S` while the call waits frees the credit within that."""
        async def answer() -> TrainResult:
            return await call_trainer(trainer, "train", batch_size, timeout_s)

        call = asyncio.ensure_future(answer())
        try:
            while not (await asyncio.wait({call}, timeout=self.SETTLE_POLL_S))[0]:
                await self.settle(buffer, work, work.version)
        except BaseException:
            call.cancel()  # the remote call goes on; its answer, if any, is not waited for
            raise
        return call.result()

    async def settle(self, buffer: Any, work: AsyncWorkScheduler, version: int) -> None:
        """After a trainer died (once it is back, and again after its replacement's first answer): the
        buffer says where each delivered, unconsumed item went while answers were lost with it: trained
        under the checkpoint the replacement loaded (consumed: the buffer forgets those leases at the
        replacement's first sample) or dropped as its sample went stale (their credit is freed, or the
        generators would wait on it); held ones come back in later batches."""
        ids = work.landed()
        fates = await self.call_surviving(buffer, "buffer", lambda: buffer.fates.call_one(ids)) if ids else {}
        trained = [i for i, f in fates.items() if f == "trained"]
        dropped = {i: f.removeprefix("dropped:") for i, f in fates.items() if f.startswith("dropped:")}
        if trained:
            work.consumed(trained, version)
        if dropped:
            work.rejected(list(dropped), list(dropped.values()))
        if trained or dropped:
            logger.warning("trainer restarted: %d items it trained under its checkpoint and %d the buffer dropped "
                           "were in answers lost with it; accounted now", len(trained), len(dropped))

    @staticmethod
    def failed(role: str, rec: Any, error: BaseException) -> RunFailed:
        used, policy = rec.restarts_used, rec.policy
        window = "" if policy.within_s is None else f" within {policy.within_s:g} s"
        return RunFailed(
            f"{role} {rec.proc_mesh}[{rec.rank}] (proc {rec.proc_id}) failed for good: its restarts are used up "
            f"(max_restarts={policy.max_restarts}{window}: run.max_restarts, run.restart_window_s; {used} used in "
            f"all); last error: {short_error(error)}",
            mesh=rec.proc_mesh, rank=rec.rank, last_error=short_error(error))


def final_checkpoint(trainer, buffer, exc: RunFailed) -> None:
    """Before a failed run stops: a last checkpoint if the trainer still serves (``resume=`` goes on from it)."""
    try:
        buffer.interrupt.options(timeout=10).call_one().get()  # a train call waiting for rollouts returns now
    except rm.RlmeshError:
        pass
    why = ""
    try:
        exc.checkpoint = call_trainer(trainer, "save", timeout=60).get()
    except rm.RlmeshError as err:
        exc.checkpoint, why = None, f" ({short_error(err)})"
    where = (f"final checkpoint {exc.checkpoint}" if exc.checkpoint
             else f"the trainer could not checkpoint{why}: its newest checkpoint stands")
    exc.args = (f"{exc.args[0]}; {where}; continue with: rlmesh run resume={rm.telemetry.current_run() or 'RUN'}",)


async def serve_work(work: AsyncWorkScheduler, stop: asyncio.Event, replica: Any, role: str,
                     call: Callable[[WorkItem], Awaitable[dict[str, Any]]], recovery: Recovery,
                     on_result: Callable[[dict[str, Any]], None] | None = None) -> None:
    """One replica's loop: take an item, run it, report it; on ``ActorDied``/``CallTimeout`` re-issue
    the item (same id, for whichever replica is free first) and wait for this replica to serve again."""
    while not stop.is_set():
        item = await work.next_item()
        try:
            result = await call(item)
        except (rm.ActorDied, rm.CallTimeout) as exc:
            work.reissue(item, short_error(exc))
            logger.warning("%s: %s; re-issued %s", role, short_error(exc), item.work_id)
            await recovery.recover(exc, replica, role)  # this replica, or a peer it called (the buffer)
            continue
        work.finished(result)
        if result["accepted"]:  # refused (stale, or done elsewhere already) it landed nowhere: not progress yet
            # the rollout landed: its generator, the buffer that took it and whatever scored it made progress
            recovery.progressed([replica, *(m for name, m in recovery.meshes.items() if name != "trainer")],
                                "rollout landed")
        if on_result is not None:
            on_result(result)


async def run_with_replicas(train: Awaitable[Any], loops: list["asyncio.Future[Any]"], stop: asyncio.Event,
                            work: AsyncWorkScheduler, ledger: WorkLedger) -> None:
    """The recipes' top level: ``train`` to its end with the replica loops beside it (the first
    failure in any of them is raised), then the loops stopped and every open item closed out."""
    ended = "the run ended before a train step used it"
    try:
        await first_failure(asyncio.ensure_future(train), loops)
    except BaseException:
        ended = "the run failed before a train step used it"
        raise
    finally:
        stop.set()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        ledger.close_out(work, ended)


async def first_failure(main: "asyncio.Future[Any]", loops: list["asyncio.Future[Any]"]) -> Any:
    """Run ``main`` to its end while ``loops`` run beside it; the first exception in any of them
    (a :class:`RunFailed` from a replica loop) cancels the rest and is raised."""
    pending = {main, *loops}
    while True:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for f in done:
            if f.cancelled():
                continue
            exc = f.exception()
            if exc is not None:
                for p in pending:
                    p.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                raise exc
        if main in done:
            return main.result()
