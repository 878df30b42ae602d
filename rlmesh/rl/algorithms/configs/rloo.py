"""RLOO's config: GRPO's settings plus its one choice.

Torch-free, so composing a recipe does not load the algorithm (see :mod:`rlmesh.rl.algorithms.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlmesh.rl.config import GRPOConfig, check

__all__ = ["RLOOConfig", "register"]


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


def register(cs: Any) -> None:
    """The plugin hook (``register(cs)``): store this algorithm's configs in Hydra's ConfigStore."""
    cs.store(group="trainer", name="rloo", node=RLOOConfig)
