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
from rlmesh.rl.agentic.sft import sft_on_demonstrations
from rlmesh.rl.backends.base import SamplingParams
from rlmesh.rl.backends.torch_backend import TorchBackend
from rlmesh.rl.batching import completions_to_generation
from rlmesh.rl.config import GRPOConfig
from rlmesh.rl.algorithms.grpo import ScoredBatch, grpo_update

__all__ = ["EpisodeBatch", "collect", "grpo_step", "heldout_accuracy", "sft_on_demonstrations", "train_grpo"]


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
    """One GRPO update on episodes: the unchanged :func:`~rlmesh.rl.algorithms.grpo.grpo_update` on their completions."""
    gen = completions_to_generation([t.completion() for t in batch.trajectories], pad_id)
    return grpo_update(model, optimizer, ScoredBatch([], gen, batch.rewards, []), config, group,
                       max_groups=config.max_groups)


def heldout_accuracy(backend: TorchBackend, env: EnvClient, task: MultiplicationTask, problems: list[Any],
                     limits: EpisodeLimits) -> tuple[float, float]:
    """Greedy episodes on held-out problems: ``(accuracy, share of episodes that called the tool)``."""
    b = collect(backend, env, task, problems, 1, limits, top_p=1e-9, prefix="eval")
    used = sum(any(t.tool for t in tr.turns) for tr in b.trajectories) / len(b.trajectories)
    return float(b.rewards.mean()), used


def train_grpo(model: nn.Module, backend: TorchBackend, env: EnvClient, task: MultiplicationTask, steps: int,
               limits: EpisodeLimits, problems_per_step: int = 16, group: int = 8, lr: float = 1e-3,
               seed: int = 5) -> None:
    """``steps`` GRPO steps in this process: each collects ``group`` episodes of ``problems_per_step``
    training problems with the model in eval mode, then updates it (AdamW, ``lr``)."""
    for p in model.parameters():  # the backend froze them for sampling
        p.requires_grad_(True)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    for step in range(steps):
        model.eval()
        batch = collect(backend, env, task, task.sample(problems_per_step, rng), group, limits, prefix=f"s{step}")
        model.train()
        grpo_step(model, opt, batch, GRPOConfig(lr=lr), group, task.tokenizer.pad_id)
    model.eval()
