"""DAPO's config: GRPO's settings with DAPO's defaults.

Torch-free, so composing a recipe does not load the algorithm (see :mod:`rlmesh.rl.algorithms.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlmesh.rl.config import GRPOConfig, check

__all__ = ["DAPOConfig", "register"]


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


def register(cs: Any) -> None:
    """The plugin hook (``register(cs)``): store this algorithm's configs in Hydra's ConfigStore."""
    cs.store(group="trainer", name="dapo", node=DAPOConfig)
