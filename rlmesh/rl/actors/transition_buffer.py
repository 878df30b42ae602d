"""``TransitionBuffer`` actor: the off-policy replay ring (:mod:`rlmesh.rl.replay`) behind async endpoints.

Generators ``add`` rollouts to it exactly as to ``ReplayBuffer`` (same signature, so
``GymGenerator`` needs no change); the trainer calls ``sample_replay``, which waits until
``new_rollouts`` rollouts have arrived since its previous call (the trainer's update-to-data
pace: gradient steps per call / env steps per call) and returns their ids with minibatch data
drawn uniformly from the whole ring.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch

import rlmesh as rm
from rlmesh.rl.replay import ReplayConfig, ReplaySample, TransitionReplayCore, transitions_from_rollout


class TransitionBuffer(rm.Actor):
    """A ring of transitions sampled uniformly; see :class:`rlmesh.rl.replay.TransitionReplayCore`."""

    def __init__(self, config: ReplayConfig | None = None, seed: int = 0) -> None:
        self.core = TransitionReplayCore(config or ReplayConfig())
        self._rng = torch.Generator().manual_seed(seed)
        self._event: asyncio.Event | None = None
        self._interrupts = 0

    def _wake(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    @rm.endpoint
    async def add(self, rollout_id: str, policy_version: int, data: Any, num_samples: int = 1) -> str:
        """Store a rollout's transitions; ``""`` when accepted, ``"duplicate"`` when the id was seen."""
        refused = self.core.add(rollout_id, policy_version, transitions_from_rollout(data))
        if refused:
            rm.telemetry.record_batch("buffer_drops", {"rollout_id": [rollout_id], "policy_version": [policy_version],
                                                       "reason": [refused], "lag": [None]})
        self._wake().set()
        return refused

    @rm.endpoint
    async def sample_replay(self, new_rollouts: int, num_minibatches: int, minibatch_size: int,
                            learning_starts: int = 0, timeout: float = 60.0) -> ReplaySample:
        """Wait up to ``timeout`` s for ``new_rollouts`` new rollouts, then sample (empty ``new`` if
        they did not come, or :meth:`interrupt` was called)."""
        deadline = time.monotonic() + timeout
        interrupts = self._interrupts
        while self.core.num_new() < new_rollouts:
            left = deadline - time.monotonic()
            if left <= 0 or self._interrupts != interrupts:
                return ReplaySample([], None, len(self.core))
            event = self._wake()
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), timeout=min(left, 1.0))
            except asyncio.TimeoutError:
                pass
        return self.core.sample(num_minibatches, minibatch_size, learning_starts, self._rng)

    @rm.endpoint
    async def interrupt(self) -> None:
        """Make a waiting ``sample_replay`` return at once (a stopping run)."""
        self._interrupts += 1
        self._wake().set()

    @rm.endpoint
    async def holding(self) -> list[str]:
        """Ids of rollouts added but not yet reported to a trainer."""
        return self.core.holding()

    @rm.endpoint
    async def stats(self) -> dict[str, float]:
        return self.core.stats()
