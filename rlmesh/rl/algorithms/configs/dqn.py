"""DQN's config, and the transition replay buffer it trains from (``buffer=transitions``).

Torch-free, so composing a recipe does not load the algorithm (see :mod:`rlmesh.rl.algorithms.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlmesh.rl.config import GymTrainerConfig, ReplayConfig, check

__all__ = ["DQNConfig", "register"]


@dataclass
class DQNConfig(GymTrainerConfig):
    """DQN hyperparameters (defaults: rl-baselines3-zoo's CartPole-v1)."""

    _target_: str = "rlmesh.rl.algorithms.dqn.DQNTrainer"
    """The trainer actor class."""

    total_steps: int = 50_000
    """Env-step budget; the exploration schedule runs over it."""
    lr: float = 2.3e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    batch_size: int = 64
    """Transitions per minibatch."""
    gradient_steps: int = 128
    """Minibatch steps per train call (one call per generator batch: this sets the update-to-data ratio)."""
    learning_starts: int = 1000
    """Transitions in the ring before the first gradient step (random-ish data first)."""
    target_update_every: int = 128
    """Gradient steps between target-network syncs."""
    tau: float = 1.0
    """Target sync rate: 1 copies, below 1 is Polyak averaging."""
    exploration_fraction: float = 0.16
    """Share of ``total_steps`` over which epsilon decays."""
    exploration_initial_eps: float = 1.0
    """Epsilon at step 0."""
    exploration_final_eps: float = 0.04
    """Epsilon after the decay."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.lr > 0, "trainer.lr", self.lr, "use a positive learning rate, e.g. 1e-3")
        check(0 < self.gamma <= 1, "trainer.gamma", self.gamma, "use a discount in (0, 1]")
        check(self.batch_size >= 1, "trainer.batch_size", self.batch_size, "use 1 or more")
        check(self.gradient_steps >= 1, "trainer.gradient_steps", self.gradient_steps, "use 1 or more")
        check(self.learning_starts >= 0, "trainer.learning_starts", self.learning_starts, "use 0 or more")
        check(self.target_update_every >= 1, "trainer.target_update_every", self.target_update_every, "use 1 or more")
        check(0 < self.tau <= 1, "trainer.tau", self.tau, "use a value in (0, 1]")
        check(0 < self.exploration_fraction <= 1, "trainer.exploration_fraction", self.exploration_fraction,
              "use a value in (0, 1]")
        check(0 <= self.exploration_final_eps <= self.exploration_initial_eps <= 1, "trainer.exploration_final_eps",
              self.exploration_final_eps, "use 0 <= final <= initial <= 1")


def register(cs: Any) -> None:
    """The plugin hook (``register(cs)``): store this algorithm's configs in Hydra's ConfigStore."""
    cs.store(group="trainer", name="dqn", node=DQNConfig)
    cs.store(group="buffer", name="transitions", node=ReplayConfig)
