"""The config dataclasses of the algorithms in :mod:`rlmesh.rl.algorithms`, kept apart from them.

Why a separate module: composing a recipe (``rlmesh run``, Hydra's ConfigStore) needs every
config class, and importing the algorithm modules would load torch and the actors (seconds) in
the controller before anything runs. This module imports only :mod:`rlmesh.rl.config`; each
algorithm module re-exports its config, and each config names its trainer in ``_target_``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlmesh.rl.config import GRPOConfig, GymTrainerConfig, PPOConfig, ReplayConfig, check  # ReplayConfig: re-exported

__all__ = ["A2CConfig", "DAPOConfig", "DQNConfig", "RLOOConfig", "ReplayConfig"]


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


@dataclass
class RLOOConfig(GRPOConfig):
    """GRPO's settings plus RLOO's one choice."""

    _target_: str = "rlmesh.rl.algorithms.rloo.RLOOTrainer"
    """The trainer actor class."""

    scale_by_std: bool = False
    """Divide the leave-one-out advantages by the batch's std (off in the paper)."""
    min_std: float = 1e-6
    """Floor of that std, so a batch of near-identical rewards does not blow up."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.min_std > 0, "trainer.min_std", self.min_std, "use a small positive floor, e.g. 1e-6")



@dataclass
class DAPOConfig(GRPOConfig):
    """GRPO's settings with DAPO's defaults, plus how hard dynamic sampling tries to refill."""

    _target_: str = "rlmesh.rl.algorithms.dapo.DAPOTrainer"
    """The trainer actor class."""

    clip_coef_high: float | None = 0.28
    """Upper ratio-clip epsilon (clip-higher)."""
    aggregation: str = "token_mean"
    """Token-level loss: every completion token of the batch weighs the same."""
    max_groups: int | None = 32
    """Informative groups per train step: dynamic sampling refills the batch up to this."""
    max_refills: int = 1
    """Extra batches of work items a step may pull from the buffer to reach ``max_groups``. Keep it
    <= ``buffer.max_policy_lag``: generation only runs that many batches ahead, so a further refill
    would wait for rollouts no generator is allowed to produce yet (and time out)."""
    refill_timeout_s: float = 60.0
    """How long one refill waits for the next batch before the step trains on what it has."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.max_groups is not None, "trainer.max_groups", self.max_groups,
              "dynamic sampling needs a target batch of informative groups, e.g. trainer.max_groups=32")
        check(self.max_refills >= 0, "trainer.max_refills", self.max_refills, "use 0 (no refill) or more")
        check(self.refill_timeout_s > 0, "trainer.refill_timeout_s", self.refill_timeout_s, "use a positive timeout")
