"""``RewardActor``: ``score(rollouts) -> rewards``.

Ships four kinds (``reward.kind``): ``env`` passes the environment's return through;
``exact_match``, ``numeric`` and ``math`` are the rule-based verifiers of
:mod:`rlmesh.rl.tasks.verifiers` (numeric compares the last number of the text; math the final
answer a math completion states, GSM8K's ``####`` format included). ``model`` is the hook for a learned reward model: subclass and
override :meth:`RewardActor.reward_model` (docs/extending.md shows one).
Every scored rollout gets a ``rewards`` telemetry row.
"""

from __future__ import annotations

import time
from typing import Any

import torch

import rlmesh as rm
from rlmesh.rl.config import RewardConfig
from rlmesh.rl.tasks.verifiers import exact_match, math_match, numeric_match


class RewardActor(rm.Actor):
    """Scores batches of rollouts. A rollout is a dict: ``rollout_id`` plus ``return``
    (env) or ``text`` and ``answer`` (verifiers, reward models)."""

    def __init__(self, config: RewardConfig | None = None) -> None:
        torch.set_num_threads(1)
        self.config = config or RewardConfig()

    @rm.endpoint
    def score(self, rollouts: list[dict[str, Any]]) -> list[float]:
        """Rewards in the order of ``rollouts``; one ``rewards`` row each."""
        t0 = time.perf_counter()
        rewards = [float(r) for r in self.score_batch(rollouts)]
        if len(rewards) != len(rollouts):
            raise ValueError(f"{type(self).__name__}.score_batch returned {len(rewards)} rewards for "
                             f"{len(rollouts)} rollouts")
        if rollouts:
            took = (time.perf_counter() - t0) / len(rollouts)
            rm.telemetry.record_batch("rewards", {
                "rollout_id": [str(r.get("rollout_id", "")) for r in rollouts], "reward": rewards,
                "scorer": [self.scorer_name()] * len(rollouts), "duration_s": [took] * len(rollouts)})
        return rewards

    # -- hooks -------------------------------------------------------------------------------------------------

    def score_batch(self, rollouts: list[dict[str, Any]]) -> list[float]:
        """Hook: score a whole batch (runs once per ``score`` call, on the actor's thread).

        The default sends ``kind='model'`` to :meth:`reward_model` in one batch and scores
        every other kind one rollout at a time with :meth:`score_one`.
        """
        if self.config.kind == "model":
            return list(self.reward_model(rollouts))
        return [self.score_one(r) for r in rollouts]

    def score_one(self, rollout: dict[str, Any]) -> float:
        """Hook: the reward of one rollout for the rule-based kinds."""
        kind = self.config.kind
        if kind == "env":
            return float(rollout["return"])
        if kind == "exact_match":
            score = exact_match(rollout["text"], rollout["answer"])
            if score == 0 and self.config.format_reward and rollout["text"].strip().isdigit():
                return self.config.format_reward
            return score
        if kind == "numeric":
            return numeric_match(rollout["text"], rollout["answer"], format_reward=self.config.format_reward)
        if kind == "math":
            return math_match(rollout["text"], rollout["answer"], format_reward=self.config.format_reward)
        raise ValueError(f"reward.kind={kind!r} has no rule-based scorer")

    def reward_model(self, rollouts: list[dict[str, Any]]) -> list[float]:
        """Hook for a learned reward model (``reward.kind=model``): score a batch of rollouts.

        Override in a subclass; load the model in ``__init__`` (it runs in the reward
        actor's own proc, so a large model never touches the controller).
        """
        raise NotImplementedError("reward.kind=model needs a RewardActor subclass that overrides reward_model(); "
                                  "see docs/extending.md")

    def scorer_name(self) -> str:
        """The ``rewards.scorer`` column: the kind, or the subclass name for a model."""
        return type(self).__name__ if self.config.kind == "model" else self.config.kind
