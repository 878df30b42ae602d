"""SAC's config. Torch-free, so composing a recipe does not load the algorithm
(see :mod:`rlmesh.rl.algorithms.configs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from rlmesh.rl.algorithms.configs.off_policy import OffPolicyConfig
from rlmesh.rl.config import check

__all__ = ["SACConfig", "register"]


@dataclass
class SACConfig(OffPolicyConfig):
    """SAC hyperparameters (defaults: SB3's, with rl-baselines3-zoo's Pendulum-v1 learning rate)."""

    _target_: str = "rlmesh.rl.algorithms.sac.SACTrainer"
    """The trainer actor class."""
    ent_coef: Optional[float] = None
    """A fixed entropy coefficient alpha; null: alpha is tuned so the policy's entropy tracks ``target_entropy``."""
    ent_coef_init: float = 1.0
    """alpha at step 0 when it is tuned."""
    target_entropy: Optional[float] = None
    """The entropy the tuning aims at; null: ``-|A|`` (minus the action dimension)."""
    log_std_init: float = -3.0
    """gSDE only: initial log std of the exploration matrix's entries."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.ent_coef is None or self.ent_coef >= 0, "trainer.ent_coef", self.ent_coef,
              "use null (tuned automatically) or a fixed coefficient >= 0")
        check(self.ent_coef_init > 0, "trainer.ent_coef_init", self.ent_coef_init, "use a positive alpha, e.g. 1.0")


def register(cs: Any) -> None:
    """The plugin hook (``register(cs)``): store ``trainer/sac``."""
    cs.store(group="trainer", name="sac", node=SACConfig)
