"""The supervised warm start of agentic recipes: teacher forcing on demonstration episodes.

RL needs a policy whose episodes sometimes succeed; a randomly initialised model never calls a
tool or copies its answer, where a pretrained LM would. A few hundred steps on demonstrations
(a task's ``demonstration(problem, use_tool)``: ``(text, sampled_by_model)`` pieces) stand in for
pretraining; a ``tool_fraction`` of them use the tool, so RL has a choice left to learn.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from rlmesh.rl.models.sampling import sequence_logprobs


def sft_on_demonstrations(model: nn.Module, task: Any, steps: int, tool_fraction: float,
                          batch_size: int = 64, lr: float = 1e-3, seed: int = 0) -> list[float]:
    """Teacher-forced cross-entropy on demonstrations, a ``tool_fraction`` of them using the tool;
    observation tokens are context only (masked out of the loss, as in RL). Returns the losses."""
    rng = random.Random(seed)
    tok = task.tokenizer
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        rows = []
        for p in task.sample(batch_size, rng, "train"):
            ids, mask = [], []
            for text, sampled in task.demonstration(p, rng.random() < tool_fraction):
                piece = tok.encode(text)
                ids += piece
                mask += [int(sampled)] * len(piece)
            rows.append((tok.encode(p.prompt, bos=True), ids + [tok.eos_id], mask + [1]))
        width = max(len(r[0]) for r in rows)
        length = width + max(len(r[1]) for r in rows)
        ids_t = torch.full((len(rows), length), tok.pad_id, dtype=torch.long)
        attn, lmask = torch.zeros_like(ids_t), torch.zeros(len(rows), length - width)
        for i, (prompt, ids, mask) in enumerate(rows):
            ids_t[i, width - len(prompt):width + len(ids)] = torch.tensor(prompt + ids)
            attn[i, width - len(prompt):width + len(ids)] = 1
            lmask[i, :len(mask)] = torch.tensor(mask, dtype=torch.float)
        logp = sequence_logprobs(model, ids_t, attn, width)
        loss = -(logp * lmask).sum() / lmask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
