"""The PPO clipped surrogate objective (Schulman et al., 2017), value loss and entropy.

One function, tensors in and a named tuple out, so ``PPOTrainer.compute_loss`` and the
single-process reference loop (:mod:`rlmesh.rl.ppo_core`) share the same maths. The
diagnostics PPO practitioners read first are returned alongside the loss:
``approx_kl`` (the low-variance k3 estimator of KL(old || new)) and ``clip_fraction``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PPOLossOutput(NamedTuple):
    """The scalar loss to backpropagate and its parts (all 0-d tensors)."""

    loss: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clip_fraction: torch.Tensor

    def metrics(self) -> dict[str, float]:
        """Namespaced floats for logging/telemetry (``losses/...``)."""
        return {f"losses/{k}": float(v.detach()) for k, v in self._asdict().items()}


def ppo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    clip_coef: float = 0.2,
    value_clip_coef: float | None = None,
    value_coef: float = 0.5,
    entropy_coef: float = 0.0,
    normalize_advantages: bool = True,
) -> PPOLossOutput:
    """Clipped PPO loss over a flat minibatch (every argument shaped [B]).

    Args:
        new_logprobs / old_logprobs: log pi(a|s) under the current and the behaviour policy.
        advantages: A(s, a), e.g. from :func:`~rlmesh.rl.losses.compute_gae`.
        new_values / old_values: the critic now and at collection time.
        returns: the critic's regression target.
        entropy: per-sample policy entropy (its mean is the bonus).
        clip_coef: epsilon of the ratio clip, ``[1 - eps, 1 + eps]``.
        value_clip_coef: if set, clip the value change to +-this around ``old_values``
            and take the pessimistic (max) of clipped and unclipped squared errors;
            ``None`` uses the plain squared error (often better, see Andrychowicz et al. 2021).
        value_coef, entropy_coef: weights in ``policy_loss + c_v * value_loss - c_e * entropy``.
        normalize_advantages: standardise advantages within the minibatch.

    The value loss is ``0.5 * mean((V - R)^2)`` so its gradient is ``mean(V - R)``.
    """
    if normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_ratio = new_logprobs - old_logprobs
    ratio = log_ratio.exp()
    surrogate = advantages * ratio
    surrogate_clipped = advantages * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
    policy_loss = -torch.min(surrogate, surrogate_clipped).mean()

    if value_clip_coef is None:
        value_loss = 0.5 * (new_values - returns).pow(2).mean()
    else:
        clipped = old_values + (new_values - old_values).clamp(-value_clip_coef, value_clip_coef)
        value_loss = 0.5 * torch.max((new_values - returns).pow(2), (clipped - returns).pow(2)).mean()

    entropy_mean = entropy.mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy_mean
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return PPOLossOutput(loss, policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction)
