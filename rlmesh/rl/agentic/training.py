"""Training on multi-turn trajectories in one process: the SFT warm start on demonstrations,
group-relative updates on episodes, and greedy held-out accuracy.

The distributed path (``AgenticGenerator`` + the unchanged ``GRPOTrainer``) trains on exactly
the same data — :meth:`Trajectory.completion` rows, observation tokens masked — and this module
is what the learning test and ``benchmarks/agentic.py`` run without procs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlmesh.rl.agentic.calculator import MultiplicationTask
from rlmesh.rl.agentic.episodes import EnvClient, EpisodeLimits, Trajectory, run_episodes
from rlmesh.rl.backends.base import SamplingParams
from rlmesh.rl.backends.torch_backend import TorchBackend
from rlmesh.rl.batching import completions_to_generation
from rlmesh.rl.config import GRPOConfig
from rlmesh.rl.grpo_core import ScoredBatch, grpo_update
from rlmesh.rl.models.sampling import sequence_logprobs


def sft_on_demonstrations(model: nn.Module, task: MultiplicationTask, steps: int, tool_fraction: float,
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


@dataclass
class EpisodeBatch:
    """Trajectories of ``len(problems) * group`` episodes (a problem's group contiguous) and rewards."""

    trajectories: list[Trajectory]
    rewards: torch.Tensor


def collect(backend: TorchBackend, env: EnvClient, task: MultiplicationTask, problems: list[Any], group: int,
            limits: EpisodeLimits, temperature: float = 1.0, top_p: float = 1.0, prefix: str = "ep",
            version: int = 0) -> EpisodeBatch:
    """``group`` episodes per problem, all in flight together."""
    episodes = [(f"{prefix}/{i}/{k}", p) for i, p in enumerate(problems) for k in range(group)]
    tok = task.tokenizer
    trajs = run_episodes(backend, env, episodes, tok.encode, limits,
                         SamplingParams(temperature=temperature, top_p=top_p, stop_token_ids=task.stop_token_ids),
                         version=lambda: version, prompt_prefix=[tok.BOS], decode=tok.decode)
    return EpisodeBatch(trajs, torch.tensor([t.reward for t in trajs], dtype=torch.float32))


def grpo_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: EpisodeBatch, config: GRPOConfig,
              group: int, pad_id: int) -> dict[str, float]:
    """One GRPO update on episodes: the unchanged :func:`~rlmesh.rl.grpo_core.grpo_update` on their completions."""
    gen = completions_to_generation([t.completion() for t in batch.trajectories], pad_id)
    return grpo_update(model, optimizer, ScoredBatch([], gen, batch.rewards, []), config, group,
                       max_groups=config.max_groups)


def heldout_accuracy(backend: TorchBackend, env: EnvClient, task: MultiplicationTask, problems: list[Any],
                     limits: EpisodeLimits) -> tuple[float, float]:
    """Greedy episodes on held-out problems: ``(accuracy, share of episodes that called the tool)``."""
    b = collect(backend, env, task, problems, 1, limits, top_p=1e-9, prefix="eval")
    used = sum(any(t.tool for t in tr.turns) for tr in b.trajectories) / len(b.trajectories)
    return float(b.rewards.mean()), used
