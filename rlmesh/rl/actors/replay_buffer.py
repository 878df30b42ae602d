"""``ReplayBuffer`` actor: :class:`rlmesh.rl.buffer.ReplayBufferCore` behind async endpoints.

Generators ``add`` to it and the trainer ``sample`` s from it, both peer to peer; the
controller never carries rollout data. ``sample`` waits (on the proc's event loop, so
``add`` calls keep landing meanwhile) until enough fresh rollouts are there. Every drop
(stale beyond ``max_policy_lag``, duplicate id, capacity) is returned to the caller and
written to the ``buffer_drops`` telemetry table with its reason.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import rlmesh as rm
from rlmesh.rl.buffer import BufferedRollout, Dropped, ReplayBufferCore, SampleResult
from rlmesh.rl.config import BufferConfig


class ReplayBuffer(rm.Actor):
    """Rollouts with their policy version; ``sample`` enforces the staleness bound."""

    def __init__(self, config: BufferConfig | None = None) -> None:
        self.core = ReplayBufferCore(config or BufferConfig())
        self.version = 0
        """The trainer's version as of its last ``sample`` call (for drops at ``add`` time)."""
        self._event: asyncio.Event | None = None
        self._interrupts = 0

    def _wake(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    @rm.endpoint
    async def add(self, rollout_id: str, policy_version: int, data: Any, num_samples: int = 1) -> str:
        """Store a rollout. Returns ``""`` when accepted, else why it was refused:
        ``"duplicate"`` (the id was seen before) or ``"stale"`` (already beyond the lag bound)."""
        dropped = self.core.add(BufferedRollout(rollout_id, policy_version, data, num_samples), self.version)
        self._report(dropped)
        self._wake().set()
        return next((d.reason for d in dropped if d.rollout_id == rollout_id), "")

    @rm.endpoint
    async def sample(self, batch_size: int, current_version: int, timeout: float = 60.0,
                     cursor: int | None = None, durable: int | None = None) -> SampleResult:
        """Up to ``timeout`` s: the oldest ``batch_size`` rollouts within ``max_policy_lag`` of
        ``current_version``; empty if not enough arrived. Drops on the way are in ``dropped``.

        With ``cursor`` (the trainer's buffer cursor: the lease of the last batch it trained)
        and ``durable`` (the cursor its newest checkpoint holds), the batch is leased and
        earlier leases are settled (:meth:`ReplayBufferCore.settle`): a restarted trainer
        gets back what its dead incarnation sampled after its checkpoint.
        """
        self.version = max(self.version, current_version)
        requeued: list[str] = []
        if cursor is not None:
            requeued = [r.rollout_id for r in self.core.settle(cursor, cursor if durable is None else durable)]
        deadline = time.monotonic() + timeout
        dropped: list[Dropped] = []
        interrupts = self._interrupts
        while True:
            res = self.core.sample(batch_size, current_version, lease=cursor is not None)
            dropped += res.dropped
            self._report(res.dropped)
            left = deadline - time.monotonic()
            if res.rollouts or left <= 0 or self._interrupts != interrupts:
                res.dropped, res.requeued = dropped, requeued
                return res
            event = self._wake()
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), timeout=min(left, 1.0))
            except asyncio.TimeoutError:
                pass

    @rm.endpoint
    async def interrupt(self) -> None:
        """Make every ``sample`` call waiting now return at once (empty unless enough arrived): a
        run that is stopping must not wait out a trainer blocked on rollouts that will never come."""
        self._interrupts += 1
        self._wake().set()

    @rm.endpoint
    async def holding(self) -> list[str]:
        """Ids of the rollouts held now (queued or leased): after a restart, what this buffer has."""
        return self.core.holding()

    @rm.endpoint
    async def stats(self) -> dict[str, float]:
        """``buffer/*`` counters since creation (added, sampled, dropped by reason, size)."""
        return self.core.stats()

    def _report(self, dropped: list[Dropped]) -> None:
        if dropped:
            rm.telemetry.record_batch("buffer_drops", {
                "rollout_id": [d.rollout_id for d in dropped], "policy_version": [d.policy_version for d in dropped],
                "reason": [d.reason for d in dropped], "lag": [d.lag for d in dropped]})
