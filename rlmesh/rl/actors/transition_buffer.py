"""``TransitionBuffer`` actor: the off-policy replay ring (:mod:`rlmesh.rl.replay`) behind async endpoints.

Generators ``add`` rollouts to it exactly as to ``ReplayBuffer`` (same signature, so
``GymGenerator`` needs no change); the trainer calls ``sample_replay``, which waits until
``new_rollouts`` rollouts have arrived since its previous call (the trainer's update-to-data
pace: gradient steps per call / env steps per call) and returns their ids with minibatch data
drawn uniformly from the whole ring.
"""

from __future__ import annotations

from typing import Any

import torch

import rlmesh as rm
from rlmesh.rl.actors.buffer_actor import BufferActor
from rlmesh.rl.replay import ReplayConfig, ReplaySample, TransitionReplayCore, transitions_from_rollout


class TransitionBuffer(BufferActor):
    """A ring of transitions sampled uniformly; see :class:`rlmesh.rl.replay.TransitionReplayCore`."""

    def __init__(self, config: ReplayConfig | None = None, seed: int = 0) -> None:
        super().__init__()
        self.core = TransitionReplayCore(config or ReplayConfig())
        self._rng = torch.Generator().manual_seed(seed)

    @rm.endpoint
    async def add(self, rollout_id: str, policy_version: int, data: Any, num_samples: int = 1) -> str:
        """Store a rollout's transitions; ``""`` when accepted, ``"duplicate"`` when the id was seen."""
        refused = self.core.add(rollout_id, policy_version, transitions_from_rollout(data))
        if refused:
            self.report_drops([rollout_id], [policy_version], [refused], [None])
        self.notify()
        return refused

    @rm.endpoint
    async def sample_replay(self, new_rollouts: int, num_minibatches: int, minibatch_size: int,
                            learning_starts: int = 0, timeout: float = 60.0) -> ReplaySample:
        """Wait up to ``timeout`` s for ``new_rollouts`` new rollouts, then sample (empty ``new`` if
        they did not come, or :meth:`interrupt` was called)."""
        if not await self.wait_until(lambda: self.core.num_new() >= new_rollouts, timeout):
            return ReplaySample([], None, len(self.core))
        return self.core.sample(num_minibatches, minibatch_size, learning_starts, self._rng)
