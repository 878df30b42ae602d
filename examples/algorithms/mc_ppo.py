"""A gym algorithm in one file: PPO with Monte-Carlo returns and a reward scale.

What differs from PPO is the advantage: discounted returns to the end of the episode
(GAE with lambda = ``mc_lambda``, 1.0 = plain Monte Carlo) minus the critic's value, with rewards
scaled by ``reward_scale`` first. So: a config dataclass (its fields are command-line settings,
``_target_`` names the trainer), a trainer subclass overriding one hook, and ``register`` for
Hydra's ConfigStore. ``conf/recipe/mc_ppo_cartpole.yaml`` is the one YAML (docs/extending.md):

    PYTHONPATH=examples/algorithms RLMESH_ALGORITHMS=mc_ppo \\
        rlmesh run recipe=mc_ppo_cartpole hydra.searchpath=[file://$PWD/examples/algorithms/conf]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from rlmesh.rl.actors import PPOTrainer
from rlmesh.rl.config import PPOConfig, check
from rlmesh.rl.ppo_core import rollout_advantages


@dataclass
class MCPPOConfig(PPOConfig):
    """PPO's settings plus the return estimator's."""

    _target_: str = "mc_ppo.MCPPOTrainer"
    mc_lambda: float = 1.0
    """Lambda of the return estimate: 1.0 = Monte Carlo (no bootstrap inside an episode)."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before the returns are computed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.mc_lambda <= 1, "trainer.mc_lambda", self.mc_lambda, "use a lambda in [0, 1]")
        check(self.reward_scale > 0, "trainer.reward_scale", self.reward_scale, "use a positive scale")


class MCPPOTrainer(PPOTrainer):
    """PPO's loss and update, this advantage."""

    config: MCPPOConfig

    def compute_advantages(self, rollout) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = replace(rollout, rewards=rollout.rewards * self.config.reward_scale)
        return rollout_advantages(scaled, self.config.gamma, gae_lambda=self.config.mc_lambda)

    def train_step(self, batch):
        return {**super().train_step(batch), "train/mc_lambda": self.config.mc_lambda}


def register(cs) -> None:
    """``trainer=mc_ppo``: the config class with its defaults (an ``rlmesh.algorithms`` entry point's shape)."""
    cs.store(group="trainer", name="mc_ppo", node=MCPPOConfig)
