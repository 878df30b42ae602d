"""RLOO (REINFORCE leave-one-out; Kool et al. 2019, Ahmadian et al. 2024), top to bottom.

A prompt is sampled ``G`` times and each completion scored; then:

1. **Advantages** (:func:`~rlmesh.rl.losses.rloo_advantages`): each completion's baseline is the
   mean reward of the *other* ``G - 1`` completions of its prompt, ``A_i = r_i - mean_{j!=i} r_j``
   ``= G/(G-1) * (r_i - mean_g)``. The baseline does not depend on the sample, so the estimator is
   unbiased; no critic, no std scaling (optional here: ``scale_by_std``).
2. **Loss and update**: GRPO's clipped token-level surrogate
   (:func:`~rlmesh.rl.algorithms.grpo.grpo_loss`, :func:`~rlmesh.rl.algorithms.grpo.grpo_update`); on-policy with
   one epoch the ratio is 1 and this is exactly REINFORCE with the leave-one-out baseline.

So :class:`RLOOTrainer` is :class:`~rlmesh.rl.algorithms.grpo.GRPOTrainer` with one hook overridden,
``compute_advantages``, and :class:`RLOOConfig` adds RLOO's one choice. ``rlmesh run
recipe=rloo_addition`` runs it; ``trainer.scale_by_std=true`` sets the extra field.
"""

from __future__ import annotations


import torch

from rlmesh.rl.algorithms.configs import RLOOConfig
from rlmesh.rl.algorithms.grpo import GRPOTrainer
from rlmesh.rl.losses import rloo_advantages

__all__ = ["RLOOConfig", "RLOOTrainer", "rloo_advantages", "scaled_rloo_advantages"]


def scaled_rloo_advantages(rewards: torch.Tensor, group_size: int, scale_by_std: bool = False,
                           min_std: float = 1e-6) -> torch.Tensor:
    """Leave-one-out advantages, optionally divided by the batch's std (floored at ``min_std``)."""
    adv = rloo_advantages(rewards, group_size)
    return adv / adv.std().clamp_min(min_std) if scale_by_std and adv.numel() > 1 else adv


class RLOOTrainer(GRPOTrainer):
    """GRPO's loss with RLOO's baseline: the only difference is this hook."""

    config: RLOOConfig

    def compute_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return scaled_rloo_advantages(rewards, group_size, self.config.scale_by_std, self.config.min_std)
