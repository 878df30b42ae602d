"""What SAC and TD3 share: the off-policy actor-critic trainer's settings and its generator's.

Torch-free, so composing a recipe does not load the algorithm (see :mod:`rlmesh.rl.algorithms.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from rlmesh.rl.config import GymGeneratorConfig, GymTrainerConfig, check

__all__ = ["OffPolicyConfig", "OffPolicyGeneratorConfig", "register"]


@dataclass
class OffPolicyGeneratorConfig(GymGeneratorConfig):
    """A gym generator stepping an off-policy actor (SAC's squashed Gaussian, TD3's deterministic one).

    The actor's shape is the trainer's: the recipes set ``hidden_sizes`` and ``use_sde`` to
    ``${trainer.hidden_sizes}`` and ``${trainer.use_sde}``, so overriding the trainer's moves both."""

    _target_: str = "rlmesh.rl.algorithms.sac.SACGenerator"
    """The generator actor class (``rlmesh.rl.algorithms.td3.TD3Generator`` for TD3)."""
    hidden_sizes: List[int] = field(default_factory=lambda: [256, 256])
    """Widths of the actor's hidden layers (follow ``trainer.hidden_sizes``)."""
    use_sde: bool = False
    """The actor carries gSDE's exploration matrix (follow ``trainer.use_sde``)."""
    sde_sample_freq: int = -1
    """gSDE: draw a new exploration matrix every this many env steps; -1: once per rollout."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.hidden_sizes) and all(h >= 1 for h in self.hidden_sizes), "generator.hidden_sizes",
              self.hidden_sizes, "use positive widths such as [256,256], or set trainer.hidden_sizes (it follows)")
        check(self.sde_sample_freq == -1 or self.sde_sample_freq >= 1, "generator.sde_sample_freq",
              self.sde_sample_freq, "use -1 (once per rollout) or 1 or more env steps")


@dataclass
class OffPolicyConfig(GymTrainerConfig):
    """A replay ring, twin critics with Polyak-averaged targets, and a bounded update-to-data ratio:
    ``gradient_steps`` gradient steps per ``train_freq`` env steps collected past ``learning_starts``."""

    total_steps: int = 20_000
    """Env-step budget."""
    lr: float = 1e-3
    """Adam learning rate of the actor and the critics (and SAC's alpha)."""
    anneal_lr: bool = False
    """Decay every optimiser's learning rate linearly from ``lr`` to 0 over ``total_steps`` env steps
    collected (SB3 and rl-zoo's ``lin_<lr>``, set at each train call from the steps collected so far)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target networks: ``target <- tau * online + (1 - tau) * target`` per update."""
    batch_size: int = 256
    """Transitions per minibatch."""
    learning_starts: int = 100
    """Env steps collected with uniformly random actions before the first gradient step."""
    train_freq: int = 1
    """Env steps per ``gradient_steps`` gradient steps: the update-to-data ratio is
    ``gradient_steps / train_freq``. The trainer never exceeds it: it waits for data instead."""
    gradient_steps: int = 1
    """Gradient steps per ``train_freq`` env steps."""
    hidden_sizes: List[int] = field(default_factory=lambda: [256, 256])
    """Widths of the hidden layers of the actor and of each critic (ReLU)."""
    normalize_obs: bool = False
    """Normalise observations by a running mean/std kept in the actor (so it travels with the weights),
    merged from each train call's minibatch draws, i.e. over the replay ring."""
    use_sde: bool = False
    """gSDE exploration (SAC): noise ``features(s) @ W`` with ``W`` redrawn every ``generator.sde_sample_freq``
    env steps, instead of independent noise at every step."""

    def rollouts_per_train(self, replicas: int) -> int:
        """One: the trainer updates after every rollout that lands (any replica's), so replicas collect
        asynchronously; the update-to-data ratio is kept by counting env steps, not calls."""
        return 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.lr > 0, "trainer.lr", self.lr, "use a positive learning rate, e.g. 1e-3")
        check(0 < self.gamma <= 1, "trainer.gamma", self.gamma, "use a discount in (0, 1]")
        check(0 < self.tau <= 1, "trainer.tau", self.tau, "use a Polyak rate in (0, 1], e.g. 0.005")
        check(self.batch_size >= 1, "trainer.batch_size", self.batch_size, "use 1 or more")
        check(self.learning_starts >= 0, "trainer.learning_starts", self.learning_starts, "use 0 or more env steps")
        check(self.train_freq >= 1, "trainer.train_freq", self.train_freq, "use 1 or more env steps")
        check(self.gradient_steps >= 1, "trainer.gradient_steps", self.gradient_steps,
              "use 1 or more (the update-to-data ratio is trainer.gradient_steps / trainer.train_freq)")
        check(bool(self.hidden_sizes) and all(h >= 1 for h in self.hidden_sizes), "trainer.hidden_sizes",
              self.hidden_sizes, "use positive widths, e.g. [256,256]")


def register(cs: Any) -> None:
    """The plugin hook (``register(cs)``): store ``generator/off_policy``."""
    cs.store(group="generator", name="off_policy", node=OffPolicyGeneratorConfig)
