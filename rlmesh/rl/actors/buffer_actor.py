"""``BufferActor``: what the two buffer actors share, the waiting and the bookkeeping endpoints.

A buffer's ``sample`` endpoint waits on the proc's event loop (so ``add`` calls keep landing
meanwhile) until its data is there, a deadline passes, or the run stops (:meth:`interrupt`).
:class:`~rlmesh.rl.actors.ReplayBuffer` (on-policy rollouts with a staleness bound) and
:class:`~rlmesh.rl.actors.TransitionBuffer` (the off-policy ring) differ only in their core and in
what "there" means; both keep their core as ``self.core`` with ``holding()`` and ``stats()``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import rlmesh as rm


class BufferActor(rm.Actor):
    """Base of the buffer actors: a wake-up event for waiting samplers, interrupts, drop reports."""

    core: Any
    """The buffer's pure-logic core (set by the subclass): ``holding()`` and ``stats()``."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._interrupted = False

    def _wake(self) -> asyncio.Event:
        if self._event is None:  # created on first use, inside the proc's event loop
            self._event = asyncio.Event()
        return self._event

    def notify(self) -> None:
        """Wake every waiting sampler: data arrived (call after each ``add``)."""
        self._wake().set()

    async def wait_until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Poll ``ready()`` now and after each :meth:`notify` (at least once a second) until it is true:
        True then; False once ``timeout`` s passed or once :meth:`interrupt` was called (before or meanwhile)."""
        deadline = time.monotonic() + timeout
        while not ready():
            left = deadline - time.monotonic()
            if left <= 0 or self._interrupted:
                return False
            event = self._wake()
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), timeout=min(left, 1.0))
            except asyncio.TimeoutError:
                pass
        return True

    @staticmethod
    def report_drops(rollout_ids: list[str], versions: list[int], reasons: list[str],
                     lags: list[int | None]) -> None:
        """One ``buffer_drops`` telemetry row per refused or evicted rollout, with its reason."""
        if rollout_ids:
            rm.telemetry.record_batch("buffer_drops", {"rollout_id": rollout_ids, "policy_version": versions,
                                                       "reason": reasons, "lag": lags})

    @rm.endpoint
    async def interrupt(self) -> None:
        """Make every ``sample`` call, waiting now or made later, return at once (empty unless enough
        arrived): a run that is stopping must not wait out a trainer blocked on rollouts that will never
        come. Later ones too: the interrupt may land while the trainer is between two samples (a busy
        host), and its next sample would then wait out its whole timeout with the final save behind it."""
        self._interrupted = True
        self.notify()

    @rm.endpoint
    async def holding(self) -> list[str]:
        """Ids of the rollouts held now and not yet settled with a trainer: after a restart, what this buffer has."""
        return self.core.holding()

    @rm.endpoint
    async def fates(self, rollout_ids: list[str]) -> dict[str, str]:
        """Where each id went (``held``, ``trained``, ``dropped:<reason>``, ``unknown``): for a controller
        whose trainer died before answering (:meth:`rlmesh.rl.buffer.ReplayBufferCore.fates`)."""
        fates = getattr(self.core, "fates", None)
        return fates(rollout_ids) if fates is not None else dict.fromkeys(rollout_ids, "unknown")

    @rm.endpoint
    async def stats(self) -> dict[str, float]:
        """``buffer/*`` counters since creation (added, sampled, dropped by reason, size)."""
        return self.core.stats()
