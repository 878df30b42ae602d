"""GRPO (Shao et al., 2024): group-relative advantages and a clipped token-level loss.

A prompt is sampled ``G`` times; each completion's advantage is its reward relative to
its siblings, so no critic is needed. The policy loss is PPO's clipped surrogate applied
per token with the sequence's advantage, masked to completion tokens, with an optional
KL penalty to a frozen reference policy using the k3 estimator
``exp(ref - logp) - (ref - logp) - 1`` (unbiased, always >= 0; Schulman 2020).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rlmesh.rl.losses.output import LossOutput


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (all of them, or along ``dim``)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1.0)


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Advantage of each sample relative to its group: ``(r - mean_g) / (std_g + eps)``.

    ``rewards`` is flat [B] with ``B = num_prompts * group_size``, the samples of a prompt
    contiguous (the layout the generators return). ``normalize_std=False`` keeps only the
    mean baseline (Dr. GRPO, Liu et al. 2025), which avoids up-weighting prompts whose
    group is almost unanimous. A group with identical rewards gets advantage 0 either way.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"grpo_advantages: rewards must be flat with a length divisible by group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    grouped = rewards.view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_std and group_size > 1:
        centered = centered / (grouped.std(dim=1, keepdim=True) + eps)
    return centered.reshape(-1)


@dataclass(frozen=True)
class GRPOLossOutput(LossOutput):
    """The scalar loss and its diagnostics (0-d tensors)."""

    policy_loss: torch.Tensor
    kl: torch.Tensor
    approx_kl: torch.Tensor
    clip_fraction: torch.Tensor


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    clip_coef: float = 0.2,
    clip_coef_high: float | None = None,
    kl_coef: float = 0.0,
    aggregation: Literal["token_mean", "sequence_mean", "sequence_sum_norm"] = "token_mean",
    norm_length: int | None = None,
) -> GRPOLossOutput:
    """Clipped-ratio loss over completion tokens.

    Args:
        logprobs: [B, L] log pi(token) under the current policy (requires grad).
        old_logprobs: [B, L] under the policy that sampled the completions.
        advantages: [B] one per completion (e.g. :func:`grpo_advantages`).
        mask: [B, L] 1 on completion tokens that count, 0 on prompt and padding.
        ref_logprobs: [B, L] under the frozen reference policy; needed if ``kl_coef > 0``.
        clip_coef: lower clip epsilon; ``clip_coef_high`` the upper one (DAPO's
            "clip-higher"), defaulting to ``clip_coef``.
        kl_coef: weight of the k3 KL(pi || ref) penalty.
        aggregation: ``"token_mean"`` averages over all valid tokens of the batch (every
            token weighs the same, as in DAPO); ``"sequence_mean"`` averages within each
            sequence, then over sequences (the original GRPO paper); ``"sequence_sum_norm"`` sums
            each sequence's tokens and divides by one constant, ``norm_length``, then averages over
            sequences (Dr. GRPO, Liu et al. 2025): no per-sequence ``1/|o_i|``, so a long wrong answer
            is not penalised less per token than a short one.
        norm_length: the constant of ``"sequence_sum_norm"``, the generation budget in tokens
            (``generator.max_new_tokens``); ``None`` uses the batch's padded completion width ``L``.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"grpo_loss: logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} "
            f"and mask {tuple(mask.shape)} must have the same [B, L] shape"
        )
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("grpo_loss: kl_coef > 0 needs ref_logprobs (or set kl_coef=0)")
    high = clip_coef if clip_coef_high is None else clip_coef_high
    adv = advantages.unsqueeze(1)
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    per_token = -torch.min(adv * ratio, adv * ratio.clamp(1.0 - clip_coef, 1.0 + high))

    if ref_logprobs is not None:
        ref_diff = ref_logprobs - logprobs
        kl_tokens = ref_diff.exp() - ref_diff - 1.0
    else:
        kl_tokens = torch.zeros_like(logprobs)
    total = per_token + kl_coef * kl_tokens

    def reduce(x: torch.Tensor) -> torch.Tensor:
        if aggregation == "token_mean":
            return masked_mean(x, mask)
        if aggregation == "sequence_mean":
            return masked_mean(x, mask, dim=1).mean()
        if aggregation == "sequence_sum_norm":
            return ((x * mask).sum(1) / (norm_length or mask.shape[1])).mean()
        raise ValueError("grpo_loss: aggregation must be 'token_mean', 'sequence_mean' or 'sequence_sum_norm', "
                         f"got {aggregation!r}")

    loss = reduce(total)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, mask)
        clip_fraction = masked_mean(((ratio < 1.0 - clip_coef) | (ratio > 1.0 + high)).float(), mask)
    return GRPOLossOutput(loss, reduce(per_token).detach(), reduce(kl_tokens).detach(), approx_kl, clip_fraction)
