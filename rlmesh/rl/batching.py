"""Backend-neutral completions -> the padded tensors GRPO trains on.

Generation backends (torch, vllm) return :class:`~rlmesh.rl.backends.base.Completion`
lists; the trainer needs the :class:`~rlmesh.rl.models.sampling.Generation` layout
(left-padded prompts, right-padded completions, masks, behaviour log-probs). This
module is the one place that conversion happens, so ``LLMGenerator`` and
``GRPOTrainer`` never depend on which backend sampled.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlmesh.rl.backends.base import Completion
from rlmesh.rl.models.sampling import Generation


def completions_to_generation(rows: Sequence[Completion], pad_id: int) -> Generation:
    """Stack completions (groups contiguous, as the backends return them) into a :class:`Generation`.

    Prompts are left-padded to the widest prompt; completions right-padded with
    ``pad_id`` and masked. A completion's log-probs must be as long as its tokens. Completions with a
    ``loss_mask`` (multi-turn trajectories: tool observations are 0) give the batch a ``loss_mask``.
    """
    if not rows:
        raise ValueError("completions_to_generation: no completions")
    width = max(len(c.prompt_ids) for c in rows)
    length = max(1, max(len(c.token_ids) for c in rows))
    n = len(rows)
    input_ids = torch.full((n, width + length), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    logprobs = torch.zeros(n, length)
    masked = any(c.loss_mask is not None for c in rows)
    loss_mask = torch.zeros(n, length, dtype=torch.long) if masked else None
    for i, c in enumerate(rows):
        if len(c.logprobs) != len(c.token_ids):
            raise ValueError(f"completion {i}: {len(c.token_ids)} tokens but {len(c.logprobs)} log-probs")
        p, t = len(c.prompt_ids), len(c.token_ids)
        input_ids[i, width - p:width] = torch.tensor(c.prompt_ids, dtype=torch.long)
        attention[i, width - p:width] = 1
        if t:
            input_ids[i, width:width + t] = torch.tensor(c.token_ids, dtype=torch.long)
            attention[i, width:width + t] = 1
            logprobs[i, :t] = torch.tensor(c.logprobs)
            if loss_mask is not None:
                if c.loss_mask is not None and len(c.loss_mask) != t:
                    raise ValueError(f"completion {i}: {t} tokens but a loss mask of {len(c.loss_mask)}")
                loss_mask[i, :t] = torch.tensor(c.loss_mask if c.loss_mask is not None else [1] * t)
    return Generation(input_ids, attention, input_ids[:, width:], logprobs, attention[:, width:], width, loss_mask)
