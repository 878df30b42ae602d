"""An LLM algorithm in one file: REINFORCE with a batch-mean baseline on the addition task.

What differs from GRPO is the advantage: each completion's reward minus the mean reward of the
whole batch (no per-prompt groups), optionally divided by the batch's std. A config dataclass, a
trainer subclass overriding one hook, ``register``; ``conf/recipe/reinforce_addition.yaml`` is the
one YAML (docs/extending.md):

    PYTHONPATH=examples/algorithms RLMESH_ALGORITHMS=reinforce_addition \\
        rlmesh run recipe=reinforce_addition hydra.searchpath=[file://$PWD/examples/algorithms/conf]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlmesh.rl.algorithms.grpo import GRPOTrainer
from rlmesh.rl.config import GRPOConfig
from rlmesh.rl.losses import reinforce_advantages


@dataclass
class ReinforceConfig(GRPOConfig):
    """GRPO's settings (loss, clipping, warm start) plus the baseline's."""

    _target_: str = "reinforce_addition.ReinforceTrainer"
    scale_by_std: bool = False
    """Divide the advantages by the batch's reward std."""


class ReinforceTrainer(GRPOTrainer):
    """GRPO's loss and update, a batch-mean baseline."""

    config: ReinforceConfig

    def compute_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        adv = reinforce_advantages(rewards, rewards.mean())
        return adv / rewards.std().clamp_min(1e-6) if self.config.scale_by_std else adv

    def train_step(self, batch):
        return {**super().train_step(batch), "train/batch_baseline": 1.0}


def register(cs) -> None:
    """``trainer=reinforce``: the config class with its defaults."""
    cs.store(group="trainer", name="reinforce", node=ReinforceConfig)
