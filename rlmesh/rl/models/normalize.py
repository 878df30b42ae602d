"""Running mean and variance of a stream, as a ``torch.nn.Module`` whose statistics are buffers.

Why a module: observation and reward normalisation (what CleanRL's wrappers and SB3's
``VecNormalize`` give continuous control) only works if the generators, the evaluator and a
resumed trainer all normalise with the *same* statistics as the trainer. As buffers of the
policy module they are in its ``state_dict``: they travel with every weight publish and land in
every checkpoint, with no side channel to keep in step.

The update is Chan et al.'s parallel merge of (mean, var, count) of a new batch into the
running totals, so the order and size of batches do not change the result.
"""

from __future__ import annotations

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Per-feature running mean/variance over the leading (batch) dimension.

    ``enabled`` is a buffer too, so a policy built with the defaults everywhere (a generator
    knows nothing of the trainer's config) normalises exactly when the trainer's weights say so.
    """

    def __init__(self, shape: tuple[int, ...] = (), clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(1e-4))
        self.register_buffer("enabled", torch.tensor(False))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge a batch ``[B, *shape]`` into the statistics (and switch normalisation on)."""
        x = x.reshape(-1, *self.mean.shape).to(self.mean.dtype)
        if x.shape[0] == 0:
            return
        b_mean, b_var, b_count = x.mean(0), x.var(0, unbiased=False), float(x.shape[0])
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean += delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta.pow(2) * self.count * b_count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)
        self.enabled.fill_(True)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``clip((x - mean) / sqrt(var + eps))``, or ``x`` unchanged while disabled."""
        if not bool(self.enabled):
            return x
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """``clip(x / sqrt(var + eps))``: rewards are scaled by the return's std, never centred."""
        if not bool(self.enabled):
            return x
        return (x / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)
