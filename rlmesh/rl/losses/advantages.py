"""Critic-free advantage baselines for sequence-level rewards: REINFORCE and RLOO.

These plug into :func:`~rlmesh.rl.algorithms.grpo.grpo_loss` in place of
:func:`~rlmesh.rl.algorithms.grpo.grpo_advantages`, which is how ``RLOOTrainer(GRPOTrainer)``
differs from GRPO: one overridden ``compute_advantages`` hook.
"""

from __future__ import annotations

import torch


def reinforce_advantages(rewards: torch.Tensor, baseline: float | torch.Tensor = 0.0) -> torch.Tensor:
    """Plain REINFORCE: ``r - b`` with a fixed or running baseline ``b``."""
    return rewards - baseline


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024).

    Each sample's baseline is the mean reward of the *other* ``group_size - 1`` samples of
    its prompt, which keeps the estimator unbiased (the baseline does not depend on the
    sample). Equivalent to ``G/(G-1) * (r - mean_g)``. ``rewards`` is flat, groups contiguous.
    """
    if group_size < 2:
        raise ValueError(f"rloo_advantages: group_size must be >= 2 (got {group_size}); use reinforce_advantages")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rloo_advantages: rewards must be flat with a length divisible by group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    grouped = rewards.view(-1, group_size)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others_mean).reshape(-1)
