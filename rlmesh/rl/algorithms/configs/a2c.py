"""A2C's config: PPO's fields with SB3's A2C defaults.

Torch-free, so composing a recipe does not load the algorithm (see :mod:`rlmesh.rl.algorithms.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlmesh.rl.config import PPOConfig, check

__all__ = ["A2CConfig", "register"]


@dataclass
class A2CConfig(PPOConfig):
    """A2C hyperparameters: PPO's fields with SB3's A2C defaults, one epoch of one minibatch."""

    _target_: str = "rlmesh.rl.algorithms.a2c.A2CTrainer"
    """The trainer actor class."""

    lr: float = 7e-4
    """RMSprop learning rate at step 0."""
    gae_lambda: float = 1.0
    """GAE lambda; 1.0 = the n-step returns of the paper."""
    update_epochs: int = 1
    """Must be 1: A2C takes one gradient step per rollout (use ``trainer=ppo`` for more)."""
    num_minibatches: int = 1
    """Must be 1: the whole rollout is one batch."""
    normalize_advantages: bool = False
    """Standardise advantages per batch (off in SB3's A2C)."""
    optimizer: str = "rmsprop"
    """``rmsprop`` (the paper's, SB3's default) or ``adam``."""
    rmsprop_alpha: float = 0.99
    """RMSprop smoothing constant."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.update_epochs == 1, "trainer.update_epochs", self.update_epochs,
              "A2C takes one gradient step per rollout: use 1 (or trainer=ppo for several epochs)")
        check(self.num_minibatches == 1, "trainer.num_minibatches", self.num_minibatches,
              "A2C trains on the whole rollout at once: use 1 (or trainer=ppo for minibatches)")
        check(self.optimizer in ("rmsprop", "adam"), "trainer.optimizer", self.optimizer, "use 'rmsprop' or 'adam'")


def register(cs: Any) -> None:
    """The plugin hook (``register(cs)``): store this algorithm's configs in Hydra's ConfigStore."""
    cs.store(group="trainer", name="a2c", node=A2CConfig)
