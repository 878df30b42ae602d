"""``ReplayBuffer`` actor: :class:`rlmesh.rl.buffer.ReplayBufferCore` behind async endpoints.

Generators ``add`` to it and the trainer ``sample`` s from it, both peer to peer; the
controller never carries rollout data. ``sample`` waits (on the proc's event loop, so
``add`` calls keep landing meanwhile) until enough fresh rollouts are there. Every drop
(stale beyond ``max_policy_lag``, duplicate id, capacity) is returned to the caller and
written to the ``buffer_drops`` telemetry table with its reason.
"""

from __future__ import annotations

from typing import Any

import rlmesh as rm
from rlmesh.rl.actors.buffer_actor import BufferActor
from rlmesh.rl.buffer import BufferedRollout, Dropped, ReplayBufferCore, SampleResult
from rlmesh.rl.config import BufferConfig


class ReplayBuffer(BufferActor):
    """Rollouts with their policy version; ``sample`` enforces the staleness bound."""

    def __init__(self, config: BufferConfig | None = None) -> None:
        super().__init__()
        self.core = ReplayBufferCore(config or BufferConfig())
        self.version = 0
        """The trainer's version as of its last ``sample`` call (for drops at ``add`` time)."""
        self._sampler = 0
        """How many leased ``sample`` calls came so far: the newest one is the trainer's, any older one
        still waiting belongs to an incarnation that died (or a call it gave up)."""

    @rm.endpoint
    async def add(self, rollout_id: str, policy_version: int, data: Any, num_samples: int = 1) -> str:
        """Store a rollout. Returns ``""`` when accepted, else why it was refused:
        ``"duplicate"`` (the id was seen before) or ``"stale"`` (already beyond the lag bound)."""
        dropped = self.core.add(BufferedRollout(rollout_id, policy_version, data, num_samples), self.version)
        self._report(dropped)
        self.notify()
        return next((d.reason for d in dropped if d.rollout_id == rollout_id), "")

    @rm.endpoint
    async def sample(self, batch_size: int, current_version: int, timeout: float = 60.0,
                     cursor: int | None = None, durable: int | None = None) -> SampleResult:
        """Up to ``timeout`` s: the oldest ``batch_size`` rollouts within ``max_policy_lag`` of
        ``current_version``; empty if not enough arrived. Drops on the way are in ``dropped``, and
        a drop returns at once (empty, unless a batch was there too): the caller frees the dropped
        rollouts' generation credit and issues their replacements.

        With ``cursor`` (the trainer's buffer cursor: the lease of the last batch it trained)
        and ``durable`` (the cursor its newest checkpoint holds), the batch is leased and
        earlier leases are settled (:meth:`ReplayBufferCore.settle`): a restarted trainer
        gets back what its dead incarnation sampled after its checkpoint.

        A leased call supersedes any earlier leased call still waiting, which then returns empty
        without taking anything: only one trainer samples, so that call's caller is gone (a trainer
        killed mid-sample, whose call the buffer keeps serving). Left waiting, it took the next
        batch onto a lease nobody would train, and the restarted trainer waited a generation round
        (4.5-6.5 s) for the one after it.
        """
        self.version = max(self.version, current_version)
        requeued: list[str] = []
        me = 0
        if cursor is not None:
            self._sampler += 1
            me = self._sampler
            self.notify()  # a superseded call still waiting returns now
            requeued = [r.rollout_id for r in self.core.settle(cursor, cursor if durable is None else durable)]
        dropped: list[Dropped] = []
        last = SampleResult([])

        def ready() -> bool:  # each try may drop stale rollouts on the way: report them as they go
            nonlocal last
            if me and me != self._sampler:
                return True  # superseded by a newer trainer call: take nothing, return empty
            last = self.core.sample(batch_size, current_version, lease=cursor is not None)
            dropped.extend(last.dropped)
            self._report(last.dropped)
            # Drops end the wait too: the controller holds generation credit for every rollout it has
            # not heard the end of, so until it hears of these it may issue nothing new, and this call
            # would wait out its timeout for rollouts that never come (a restarted trainer, a version
            # ahead of everything in flight, found only stale rollouts: the whole timeout, 120 s).
            return bool(last.rollouts) or bool(dropped)

        await self.wait_until(ready, timeout)
        last.dropped, last.requeued = dropped, requeued
        return last

    def _report(self, dropped: list[Dropped]) -> None:
        self.report_drops([d.rollout_id for d in dropped], [d.policy_version for d in dropped],
                          [d.reason for d in dropped], [d.lag for d in dropped])
