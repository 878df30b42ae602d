"""TD3's config. Torch-free, so composing a recipe does not load the algorithm
(see :mod:`rlmesh.rl.algorithms.configs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from rlmesh.rl.algorithms.configs.off_policy import OffPolicyConfig
from rlmesh.rl.config import check

__all__ = ["TD3Config", "register"]


@dataclass
class TD3Config(OffPolicyConfig):
    """TD3 hyperparameters (defaults: SB3's; ``trainer/td3_pendulum.yaml`` sets rl-baselines3-zoo's)."""

    _target_: str = "rlmesh.rl.algorithms.td3.TD3Trainer"
    """The trainer actor class."""
    hidden_sizes: List[int] = field(default_factory=lambda: [400, 300])
    """Widths of the hidden layers (the TD3 paper's)."""
    policy_delay: int = 2
    """Critic updates per actor (and target) update."""
    target_policy_noise: float = 0.2
    """Std of the Gaussian noise on the target action (target policy smoothing), in [-1, 1] action units."""
    target_noise_clip: float = 0.5
    """That noise is clipped to +-this."""
    exploration_noise: float = 0.1
    """Std of the Gaussian noise generators add to the actor's action, in [-1, 1] units (it travels in the weights)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.policy_delay >= 1, "trainer.policy_delay", self.policy_delay, "use 1 or more (the paper's 2)")
        check(self.target_policy_noise >= 0, "trainer.target_policy_noise", self.target_policy_noise, "use 0 or more")
        check(self.target_noise_clip >= 0, "trainer.target_noise_clip", self.target_noise_clip, "use 0 or more")
        check(self.exploration_noise >= 0, "trainer.exploration_noise", self.exploration_noise, "use 0 or more")
        check(not self.use_sde, "trainer.use_sde", self.use_sde,
              "TD3's actor is deterministic: gSDE is for trainer=sac and trainer=ppo; tune trainer.exploration_noise")


def register(cs: Any) -> None:
    """The plugin hook (``register(cs)``): store ``trainer/td3``."""
    cs.store(group="trainer", name="td3", node=TD3Config)
