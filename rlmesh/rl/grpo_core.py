"""The reference GRPO loop, single process, on a verifiable task.

Split the way the distributed recipe splits it:

- :func:`generate_and_score` is ``LLMGenerator.generate`` followed by
  ``RewardActor.score``: N completions per prompt with the KV-cache sampler, decoded and
  checked by the task's verifier.
- :func:`grpo_update` is ``GRPOTrainer.train_step``: group-relative advantages, then the
  clipped token-level loss of :mod:`rlmesh.rl.losses.grpo`.
- :func:`evaluate_heldout` is the eval step (``metric='mean_reward'``): greedy decoding on
  held-out prompts.
- :func:`sft_warmstart` is an optional supervised warm start on the task format. RL
  needs a policy whose samples are sometimes right (a group of all-zero rewards has zero
  advantage); a randomly initialised model almost never is, where a pretrained LM would
  be. A few hundred teacher-forced steps stand in for pretraining.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from rlmesh.rl.config import GRPOConfig, LLMGeneratorConfig
from rlmesh.rl.losses import grpo_advantages, grpo_loss
from rlmesh.rl.models.sampling import Generation, generate, sequence_logprobs
from rlmesh.rl.tasks.addition import AdditionTask, Problem

logger = logging.getLogger(__name__)


@dataclass
class ScoredBatch:
    """Completions for ``len(problems) * n`` rows and their rewards (rows grouped by prompt)."""

    problems: list[Problem]
    generation: Generation
    rewards: torch.Tensor
    texts: list[str]


@torch.no_grad()
def generate_and_score(
    model: nn.Module, task: AdditionTask, problems: list[Problem], config: LLMGeneratorConfig,
    generator: torch.Generator | None = None, partial_credit: bool = False,
) -> ScoredBatch:
    """Sample ``config.samples_per_prompt`` completions per problem and verify each
    (exact match, or per-digit credit with ``partial_credit``)."""
    tok = task.tokenizer
    n = config.samples_per_prompt
    gen = generate(model, [task.encode_prompt(p) for p in problems], n=n, max_new_tokens=config.max_new_tokens,
                   temperature=config.temperature, top_p=config.top_p, eos_id=tok.eos_id, pad_id=tok.pad_id,
                   generator=generator)
    texts = [tok.decode(row) for row in gen.completion_ids.tolist()]
    rewards = torch.tensor([task.score(t, problems[i // n], partial_credit) for i, t in enumerate(texts)])
    return ScoredBatch(problems, gen, rewards, texts)


def grpo_update(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: ScoredBatch, config: GRPOConfig,
    group_size: int, temperature: float = 1.0, ref_model: nn.Module | None = None, max_groups: int | None = None,
    advantages: torch.Tensor | None = None, loss_fn: Callable[..., Any] | None = None,
) -> dict[str, float]:
    """One GRPO train step on a scored batch; returns ``losses/*`` and ``train/*`` metrics.

    Groups whose rewards are all equal have zero advantage and are skipped. With
    ``max_groups``, at most that many informative groups are trained on: oversample
    prompts at generation time and keep a full batch of signal (DAPO's dynamic sampling,
    Yu et al. 2025) once most groups become unanimous. ``advantages`` (flat, one per row) replaces
    the group-relative ones and ``loss_fn`` (the arguments and result of
    :func:`~rlmesh.rl.losses.grpo_loss`) the loss: ``GRPOTrainer``'s two hooks.
    """
    gen = batch.generation
    if advantages is None:
        advantages = grpo_advantages(batch.rewards, group_size, normalize_std=config.normalize_std)
    loss_fn = loss_fn or grpo_loss
    mask = gen.trained_mask.float()  # observation tokens of multi-turn trajectories are read, not trained
    ref_logprobs = None
    if config.kl_coef > 0:
        if ref_model is None:
            raise ValueError("grpo_update: trainer.kl_coef > 0 needs a ref_model (or set trainer.kl_coef=0)")
        with torch.no_grad():
            ref_logprobs = sequence_logprobs(ref_model, gen.input_ids, gen.attention_mask, gen.prompt_len, temperature)
    # Groups with identical rewards carry no signal; skipping them saves compute, not bias.
    informative_groups = advantages.view(-1, group_size).abs().sum(1) > 0
    metrics: dict[str, float] = {"train/informative_fraction": float(informative_groups.float().mean())}
    groups = informative_groups.nonzero().squeeze(1)[:max_groups]
    if groups.numel() == 0:
        return metrics
    rows = (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)
    metrics["train/groups"] = float(groups.numel())
    out = None
    for _ in range(config.update_epochs):
        logprobs = sequence_logprobs(model, gen.input_ids[rows], gen.attention_mask[rows], gen.prompt_len, temperature)
        out = loss_fn(logprobs, gen.completion_logprobs[rows], advantages[rows], mask[rows],
                        ref_logprobs=None if ref_logprobs is None else ref_logprobs[rows],
                        clip_coef=config.clip_coef, clip_coef_high=config.clip_coef_high, kl_coef=config.kl_coef,
                        aggregation=config.aggregation, norm_length=config.norm_length)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        metrics["train/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
        optimizer.step()
    assert out is not None
    metrics.update(out.metrics())
    return metrics


@torch.no_grad()
def evaluate_heldout(model: nn.Module, task: AdditionTask, problems: list[Problem]) -> float:
    """Mean verifier reward of greedy completions (top-p close to 0 keeps only the argmax)."""
    greedy = LLMGeneratorConfig(samples_per_prompt=1, max_new_tokens=task.max_answer_len, top_p=1e-9)
    return float(generate_and_score(model, task, problems, greedy).rewards.mean())


def sft_warmstart(
    model: nn.Module, task: AdditionTask, steps: int, batch_size: int = 64, lr: float = 1e-3, seed: int = 0,
    on_step: Callable[[int], None] | None = None,
) -> list[float]:
    """Teacher-forced cross-entropy on ``prompt -> answer<eos>`` (loss on answer tokens only).

    Returns the loss per step. Uses the train split only. ``on_step(steps_done)`` after each step
    (progress reporting).
    """
    rng = random.Random(seed)
    tok = task.tokenizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        problems = task.sample(batch_size, rng, "train")
        prompts = [task.encode_prompt(p) for p in problems]
        answers = [tok.encode(p.answer, eos=True) for p in problems]
        width = max(len(p) for p in prompts)
        length = width + max(len(a) for a in answers)
        ids = torch.full((batch_size, length), tok.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, (p, a) in enumerate(zip(prompts, answers)):
            ids[i, width - len(p):width + len(a)] = torch.tensor(p + a)
            attn[i, width - len(p):width + len(a)] = 1
        logprobs = sequence_logprobs(model, ids, attn, width)
        loss = -(logprobs * attn[:, width:]).sum() / attn[:, width:].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(len(losses))
    return losses


def frozen_copy(model: nn.Module) -> nn.Module:
    """A detached, eval-mode copy to serve as the KL reference policy."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
