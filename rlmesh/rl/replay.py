"""Off-policy replay: a ring of single transitions, sampled uniformly, old data included.

:class:`~rlmesh.rl.buffer.ReplayBufferCore` serves on-policy algorithms: whole rollouts,
consumed once, never older than ``max_policy_lag``. Off-policy value methods (DQN, SAC) want the
opposite: every transition kept until the ring overwrites it, and minibatches drawn uniformly
from all of it, however old, many times each. That is this class; the ``TransitionBuffer`` actor
(:mod:`rlmesh.rl.actors.transition_buffer`) wraps it exactly as ``ReplayBuffer`` wraps the
on-policy core. Pure torch, no actor: unit-tested directly.

What is kept from the on-policy buffer's contract: a rollout id is accepted once (a re-issued
work item whose original also landed is refused as a duplicate), and every accepted rollout is
reported to the next ``sample`` call as *new* (the trainer counts env steps and paces its
update-to-data ratio on them; the controller's work accounting consumes their ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlmesh.rl.config import ReplayConfig
from rlmesh.rl.rollout import Rollout


@dataclass
class Transitions:
    """A batch of ``(s, a, r, s', terminated)``, leading dimension the batch."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    def __getitem__(self, idx: slice | torch.Tensor) -> Transitions:
        return Transitions(self.obs[idx], self.actions[idx], self.rewards[idx], self.next_obs[idx],
                           self.terminated[idx])


def transitions_from_rollout(rollout: Rollout) -> Transitions:
    """The real transitions of a rollout, flattened (time-major).

    With gymnasium's NEXT_STEP autoreset the next state of step ``t`` is ``obs[t + 1]`` (on an
    episode's last step that is its true final observation) and of the last step ``last_obs``;
    the autoreset steps (``valid`` False) are not transitions and are dropped. ``terminated``
    (not truncated) is what cuts the bootstrap.
    """
    if rollout.last_obs is None:
        raise ValueError("transitions_from_rollout: the rollout has no last_obs (collect it with RolloutCollector)")
    next_obs = torch.cat([rollout.obs[1:], rollout.last_obs.unsqueeze(0)])
    keep = rollout.valid.reshape(-1)
    flat = lambda x: x.reshape(-1, *x.shape[2:])[keep]  # noqa: E731
    return Transitions(flat(rollout.obs), flat(rollout.actions), flat(rollout.rewards), flat(next_obs),
                       flat(rollout.terminated))


@dataclass
class NewRollout:
    """What the trainer and the controller learn of a rollout that arrived since the last sample."""

    rollout_id: str
    policy_version: int
    num_samples: int


@dataclass
class ReplaySample:
    """One ``sample`` call's answer: the rollouts new since the last call, and minibatch data."""

    new: list[NewRollout] = field(default_factory=list)
    transitions: Transitions | None = None
    """``num_minibatches * minibatch_size`` transitions drawn uniformly with replacement, or
    ``None`` while the ring holds fewer than ``learning_starts``."""
    size: int = 0
    """Transitions held after the new ones were added."""

    @property
    def new_samples(self) -> int:
        return sum(r.num_samples for r in self.new)


class TransitionReplayCore:
    """A ring of transitions (allocated on the first add, from its shapes) plus the new-rollout log."""

    def __init__(self, config: ReplayConfig | None = None) -> None:
        self.config = config or ReplayConfig()
        self._data: Transitions | None = None
        self._next = 0
        self._size = 0
        self._seen: set[str] = set()
        self._new: list[NewRollout] = []
        self.added = 0
        self.duplicates = 0

    def __len__(self) -> int:
        return self._size

    def add(self, rollout_id: str, policy_version: int, batch: Transitions) -> str:
        """Write a rollout's transitions into the ring. Returns ``""``, or ``"duplicate"`` if the id was seen."""
        if rollout_id in self._seen:
            self.duplicates += 1
            return "duplicate"
        self._seen.add(rollout_id)
        n, cap = len(batch), self.config.capacity
        if self._data is None:
            self._data = Transitions(*(torch.zeros((cap, *x.shape[1:]), dtype=x.dtype) for x in
                                       (batch.obs, batch.actions, batch.rewards, batch.next_obs, batch.terminated)))
        idx = (self._next + torch.arange(n)) % cap
        for name in ("obs", "actions", "rewards", "next_obs", "terminated"):
            getattr(self._data, name)[idx] = getattr(batch, name).to(getattr(self._data, name).dtype)
        self._next = (self._next + n) % cap
        self._size = min(cap, self._size + n)
        self._new.append(NewRollout(rollout_id, policy_version, n))
        self.added += 1
        return ""

    def num_new(self) -> int:
        """Rollouts added since the last :meth:`sample`."""
        return len(self._new)

    def sample(self, num_minibatches: int, minibatch_size: int, learning_starts: int = 0,
               generator: torch.Generator | None = None) -> ReplaySample:
        """Hand over the new-rollout log and ``num_minibatches * minibatch_size`` uniform draws."""
        new, self._new = self._new, []
        out = ReplaySample(new, None, self._size)
        if self._data is not None and self._size >= max(1, learning_starts) and num_minibatches > 0:
            idx = torch.randint(self._size, (num_minibatches * minibatch_size,), generator=generator)
            out.transitions = self._data[idx]
        return out

    def holding(self) -> list[str]:
        """Ids of rollouts whose arrival no trainer has been told of yet."""
        return [r.rollout_id for r in self._new]

    def stats(self) -> dict[str, float]:
        return {"buffer/size": float(self._size), "buffer/added": float(self.added),
                "buffer/dropped_duplicate": float(self.duplicates), "buffer/pending": float(len(self._new))}
