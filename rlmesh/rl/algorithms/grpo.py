"""GRPO (Shao et al., 2024), top to bottom: advantages, loss, update, the trainer actor.

Read in order, this file is the whole algorithm on a batch of scored completions:

1. **Advantages** (:func:`grpo_advantages`): a prompt is sampled ``G`` times; each completion's
   advantage is its reward relative to its siblings (centred, and scaled with ``normalize_std``),
   so no critic is needed.
2. **Loss** (:func:`grpo_loss`): PPO's clipped surrogate applied per token with the sequence's
   advantage, masked to completion tokens, with an optional KL penalty to a frozen reference
   policy using the k3 estimator ``exp(ref - logp) - (ref - logp) - 1`` (unbiased, always >= 0;
   Schulman 2020). ``aggregation`` chooses how tokens are averaged (GRPO's per-sequence mean,
   DAPO's token mean, Dr. GRPO's constant normaliser).
3. **Update** (:func:`grpo_update`): ``update_epochs`` passes over the informative groups (groups
   whose rewards all agree carry no policy gradient and, without a KL term, are skipped), the loss
   averaged over the whole batch (a skipped group counts as the zero it contributes), gradient clipping.
4. **Warm start and reference loop** (:func:`sft_warmstart`, :func:`generate_and_score`,
   :func:`evaluate_heldout`): a supervised warm start on the task format for the built-in
   transformer (RL needs a policy whose samples are sometimes right; a pretrained LM would be),
   and the single-process loop the distributed recipe splits into actors.
5. **The actor** (:class:`GRPOTrainer`): the update on batches sampled from the buffer, with the
   hooks :meth:`~GRPOTrainer.compute_advantages` and :meth:`~GRPOTrainer.compute_loss` that make
   RLOO (:mod:`rlmesh.rl.algorithms.rloo`) and DAPO (:mod:`rlmesh.rl.algorithms.dapo`) small
   subclasses. Its config is :class:`~rlmesh.rl.config.GRPOConfig`.

Sections 1-4 are tensors in, tensors out (unit-tested without processes).
"""

from __future__ import annotations

import copy
import logging
import math
import pathlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

import rlmesh as rm
from rlmesh.rl.actors.trainer import Trainer
from rlmesh.rl.backends.torch_backend import build_policy_model
from rlmesh.rl.batching import completions_to_generation
from rlmesh.rl.config import GRPOConfig, LLMGeneratorConfig
from rlmesh.rl.losses.output import LossOutput
from rlmesh.rl.models.hf import BaseOf, adapter_state_dict, save_folder
from rlmesh.rl.models.sampling import Generation, generate, sequence_logprobs
from rlmesh.rl.tasks.addition import AdditionTask, Problem
from rlmesh.rl.train.sharding import RankWeightedLoss, grpo_units, split_groups
from rlmesh.rl.run.warmup import WarmupPhase

logger = logging.getLogger(__name__)

# -- 1-2. advantages and loss ------------------------------------------------------------------------------------

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


# -- 3-4. update, warm start, reference loop ----------------------------------------------------------------


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

    Groups whose rewards are all equal have zero advantage: without a KL term they have no gradient
    and are skipped (compute saved), with one they are trained for it. The loss is still the whole
    batch's average (:func:`batch_rows`): ``token_mean`` divides by every completion token of the
    batch, as TRL's ``loss_type="dapo"`` does, so the step's gradient does not grow as fewer groups
    happen to be informative (with informative tokens alone as the divisor, a step with one informative
    group of eight weighed 8x its share, and often hit ``max_grad_norm``). With ``max_groups``, at most
    that many informative groups are trained on and the average is over them alone: DAPO's dynamic
    sampling (Yu et al. 2025) oversamples prompts and keeps a full batch of signal, so its batch is the
    groups it keeps. ``advantages`` (flat, one per row) replaces the group-relative ones and ``loss_fn``
    (the arguments and result of :func:`grpo_loss`) the loss: ``GRPOTrainer``'s two hooks.
    """
    gen = batch.generation
    if advantages is None:
        advantages = grpo_advantages(batch.rewards, group_size, normalize_std=config.normalize_std)
    loss_fn = loss_fn or grpo_loss
    mask = gen.trained_mask.float()  # observation tokens of multi-turn trajectories are read, not trained
    if config.kl_coef > 0 and ref_model is None:
        raise ValueError("grpo_update: trainer.kl_coef > 0 needs a ref_model (or set trainer.kl_coef=0)")
    informative_groups = advantages.view(-1, group_size).abs().sum(1) > 0
    metrics: dict[str, float] = {"train/informative_fraction": float(informative_groups.float().mean())}
    trained, counted = batch_rows(informative_groups, group_size, config.kl_coef > 0, max_groups)
    if trained.numel() == 0:
        return metrics
    metrics["train/groups"] = float(trained.numel() // group_size)
    # Micro-batches: each chunk's loss is weighted by its share of what the whole batch's loss averages
    # over (tokens for token_mean, sequences otherwise), so the summed gradients are the full batch's.
    size = getattr(config, "micro_batch_size", None) or len(trained)
    chunks = [trained[i:i + size] for i in range(0, len(trained), size)]
    token_mean = config.aggregation == "token_mean"
    trained_tokens = mask[trained].sum().clamp_min(1.0)
    counted_tokens = mask[counted].sum().clamp_min(1.0)
    weights = [float(mask[c].sum() / counted_tokens) if token_mean else len(c) / len(counted) for c in chunks]
    # the diagnostics (losses/*) are means over the trained rows alone, however the loss is normalised
    shares = [float(mask[c].sum() / trained_tokens) if token_mean else len(c) / len(trained) for c in chunks]
    refs: list[torch.Tensor | None] = [None] * len(chunks)
    if config.kl_coef > 0:
        with torch.no_grad():
            refs = [sequence_logprobs(ref_model, gen.input_ids[c], gen.attention_mask[c], gen.prompt_len, temperature)
                    for c in chunks]
    parts: list[dict[str, float]] = []
    for _ in range(config.update_epochs):
        optimizer.zero_grad(set_to_none=True)
        parts = []
        for c, w, ref in zip(chunks, weights, refs):
            logprobs = sequence_logprobs(model, gen.input_ids[c], gen.attention_mask[c], gen.prompt_len, temperature)
            out = loss_fn(logprobs, gen.completion_logprobs[c], advantages[c], mask[c], ref_logprobs=ref,
                          clip_coef=config.clip_coef, clip_coef_high=config.clip_coef_high, kl_coef=config.kl_coef,
                          aggregation=config.aggregation, norm_length=config.norm_length)  # type: ignore[arg-type]  # checked by the config
            (out.loss * w).backward()
            parts.append(out.metrics())
        metrics["train/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
        optimizer.step()
    metrics.update({k: sum(w * m[k] for w, m in zip(shares, parts)) for k in parts[0]})
    # -log p of the sampled tokens, averaged: a Monte Carlo estimate of the sampling policy's entropy
    metrics["train/entropy"] = float(-(gen.completion_logprobs[trained] * mask[trained]).sum() / trained_tokens)
    metrics["train/tokens"] = float(trained_tokens)
    metrics["train/normaliser_tokens" if token_mean else "train/normaliser_rows"] = \
        float(counted_tokens) if token_mean else float(len(counted))
    return metrics


def batch_rows(informative: torch.Tensor, group_size: int, kl: bool = False,
               max_groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(trained, counted)``: the rows a GRPO step runs forward and backward, and the rows its loss
    averages over (every row of ``counted`` weighs the same; a counted row that is not trained adds the
    zero its gradient would be). ``informative`` is one bool per group of ``group_size`` rows.

    - Without ``max_groups``: every row is counted (the batch's mean, TRL's ``dapo`` and ``grpo`` losses);
      the informative groups are trained, and with ``kl`` the unanimous ones too (the KL term has a
      gradient there).
    - With ``max_groups`` (dynamic sampling): the first ``max_groups`` informative groups are trained
      and counted, nothing else (DAPO's batch is the informative groups it keeps).
    """
    groups = informative.nonzero().squeeze(1)
    if max_groups is not None:
        trained_groups = counted_groups = groups[:max_groups]
    else:
        counted_groups = torch.arange(informative.numel())
        trained_groups = counted_groups if kl else groups

    def rows(g: torch.Tensor) -> torch.Tensor:
        return (g[:, None] * group_size + torch.arange(group_size)).reshape(-1)

    return rows(trained_groups), rows(counted_groups)


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


# -- 5. the trainer actor --------------------------------------------------------------------------------------


class GRPOTrainer(Trainer):
    """GRPO over completions. ``task`` brings the tokenizer (padding) and the optional SFT warm start.

    Args:
        model_config / model_path: the same model description the generators' backend gets.
        temperature: the generators' sampling temperature (log-probs are taken under it).
        pad_id: padding token; ``None``: the task's tokenizer's (the model's, for a model folder).
        dtype: parameter dtype of a model folder (``float32`` or ``bfloat16``).
        gradient_checkpointing: recompute activations in the backward pass (model folders).
        lora: LoRA adapters (a :class:`~rlmesh.rl.config.LoRAConfig` with ``r > 0``): only they train
            and only they are published; the KL reference is the same model with them switched off.
    """

    config: GRPOConfig

    def __init__(self, config: GRPOConfig, buffer: Any = None, model_config: Any = None, model_path: str | None = None,
                 task: Any = None, temperature: float = 1.0, pad_id: int | None = None, weights: str = "policy",
                 seed: int = 0, dtype: str = "float32", gradient_checkpointing: bool = False, lora: Any = None) -> None:
        self.model_config, self.model_path, self.task = model_config, model_path, task
        self.lora = lora if lora is not None and lora.r > 0 else None
        if pad_id is None:
            pad_id = task.tokenizer.pad_id if task is not None and task.tokenizer is not None else 0
        self.temperature, self.pad_id = temperature, pad_id
        self.dtype, self.gradient_checkpointing = dtype, gradient_checkpointing
        self.ref_model: torch.nn.Module | None = None
        self.ref_source = "checkpoint"
        """Where the KL reference comes from on a resume: ``folder`` (the model folder as loaded: no warm
        start changed it; rebuilt from it, never saved) or ``checkpoint`` (saved with the policy)."""
        super().__init__(config, buffer, weights, seed)

    def build_model(self) -> torch.nn.Module:
        model = build_policy_model(self.model_config, self.model_path, self.dtype, self.lora)[0].train()
        if self.gradient_checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                raise ValueError("model.gradient_checkpointing=true is for model folders (model.path); the built-in "
                                 "transformer is small enough without it")
            model.gradient_checkpointing_enable()
        return model

    def learning_rate(self, step: int) -> float:
        """The learning rate of train step ``step`` (0-based): linear warm-up over ``warmup_steps``, then
        ``lr_schedule`` (``constant``, or ``linear`` / ``cosine`` decay to 0 at ``lr_decay_steps``)."""
        c = self.config
        if step < c.warmup_steps:
            return c.lr * (step + 1) / c.warmup_steps
        if c.lr_schedule == "constant" or not c.lr_decay_steps:
            return c.lr
        progress = min(1.0, (step - c.warmup_steps) / max(1, c.lr_decay_steps - c.warmup_steps))
        if c.lr_schedule == "linear":
            return c.lr * (1.0 - progress)
        return c.lr * 0.5 * (1.0 + math.cos(math.pi * progress))

    @rm.endpoint
    def export(self, path: str) -> str:
        """Write the current policy as a Hugging Face folder at ``path`` (model folders only): what
        ``AutoModelForCausalLM.from_pretrained`` loads, tokenizer and chat template included.

        On a trainer mesh every rank must be called (``call_trainer``): the full weights are gathered
        (FSDP2 holds a shard per rank) and rank 0 writes the folder. With LoRA only the adapters are
        gathered (the base weights never train: they are the folder's): rank 0 loads them into one
        fresh copy of the model built from the folder and merges them into it in place, so it holds
        one whole model beside its shard, not the gathered one as well."""
        base = self.model.module if self.group is not None and hasattr(self.model, "module") else self.model  # DDP
        inner = getattr(base, "model", None)
        if inner is None or not hasattr(inner, "save_pretrained"):
            raise ValueError("export writes Hugging Face folders: the built-in transformer has none (its weights "
                             "are in the trainer's checkpoints)")
        if self.group is not None:
            tokenizer = getattr(self.task, "tokenizer", None)
            out = pathlib.Path(path)
            if self.lora is not None:
                adapters = self.group.gather_entries(self.model, self._published_keys())  # every rank takes part
                if adapters is None:
                    return str(path)
                with torch.random.fork_rng():  # its fresh adapters draw from torch's RNG: leave the run's alone
                    whole = build_policy_model(self.model_config, self.model_path, self.dtype, self.lora)[0]
                unexpected = whole.load_state_dict(adapters, strict=False).unexpected_keys
                assert not unexpected, f"adapters the fresh copy does not have: {unexpected[:3]}"
                merged = whole.model.merge_and_unload()  # in place: the copy is this export's own
                out.mkdir(parents=True, exist_ok=True)
                merged.save_pretrained(out)
                del whole, merged
            else:
                full = self.group.full_state_dict(self.model)  # every rank takes part; rank 0 gets the whole model
                if full is None:
                    return str(path)
                out.mkdir(parents=True, exist_ok=True)
                inner.save_pretrained(out, state_dict={k.removeprefix("model."): v for k, v in full.items()})
            if tokenizer is not None and hasattr(tokenizer, "hf"):
                tokenizer.hf.save_pretrained(out)
            logger.info("exported the policy at version %d to %s (gathered from %d ranks)", self.version, out,
                        self.group.world)
            return str(out)
        out = save_folder(self.model, path, getattr(self.task, "tokenizer", None))
        logger.info("exported the policy at version %d to %s", self.version, out)
        return str(out)

    def published_state(self) -> dict[str, Any]:
        """With LoRA, the adapters only (a few MB): the generators hold the same base weights."""
        return adapter_state_dict(self.model) if self.lora is not None else super().published_state()

    def build_optimizer(self) -> torch.optim.Optimizer:
        """Adam over the parameters that train (with LoRA: the adapters; no moments for frozen weights)."""
        return torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad], lr=self.config.lr)

    def _reference(self) -> torch.nn.Module:
        """The frozen KL reference: with LoRA the model itself with its adapters off (no second copy)."""
        return BaseOf(self.model) if self.lora is not None else frozen_copy(self.model)

    def setup(self) -> None:
        """SFT warm start (``trainer.sft_steps``; the task's own ``warm_start`` if it has one), then freeze a reference copy if ``kl_coef > 0``."""
        if self.config.sft_steps:
            if self.task is None:
                raise ValueError("trainer.sft_steps > 0 needs the task (GRPOTrainer(task=...))")
            with WarmupPhase("SFT warm start", total=self.config.sft_steps) as phase:  # its own progress bar
                if hasattr(self.task, "warm_start"):  # a task with its own demonstrations (multi-turn tool episodes)
                    self.task.warm_start(self.model, self.config.sft_steps, lr=self.config.sft_lr, seed=self.seed)
                else:
                    sft_warmstart(self.model, self.task, self.config.sft_steps, lr=self.config.sft_lr, seed=self.seed,
                                  on_step=phase.update)
        if self.config.kl_coef > 0:
            self.ref_model = self._reference()
            self.ref_source = "folder" if self.model_path and not self.config.sft_steps else "checkpoint"
        self.optimizer = self.build_optimizer()  # fresh Adam moments after the warm start

    def samples_in(self, batch: list[dict[str, Any]]) -> int:
        return sum(len(item["completions"]) for item in batch)

    def frozen_modules(self) -> dict[str, torch.nn.Module]:
        """The KL reference copy (``kl_coef > 0`` without LoRA; with LoRA the reference is the model itself)."""
        return {"ref_model": self.ref_model} if self.ref_model is not None and self.lora is None else {}

    def checkpointed_modules(self) -> dict[str, torch.nn.Module]:
        """The KL reference when a warm start made it (each rank saves its shard); one that is the model
        folder as loaded is rebuilt from the folder on a resume, never saved."""
        return self.frozen_modules() if self.ref_source == "checkpoint" else {}

    def checkpoint_extra(self) -> dict[str, Any]:
        """Whether a KL reference exists and where a resumed trainer gets it (:attr:`ref_source`): a resumed
        trainer skips :meth:`setup`, which made it."""
        return {"ref": self.ref_source} if self.frozen_modules() else {}

    def restore_extra(self, extra: dict[str, Any]) -> None:
        """Builds the KL reference the checkpoint had, before :class:`Trainer` loads its saved weights into
        it (``ref: checkpoint``). On a mesh ``on_group`` built it (sharded) from the freshly loaded folder."""
        if self.lora is not None:
            self.ref_model = self._reference() if self.config.kl_coef > 0 else None
            return
        self.ref_source = extra.get("ref", "checkpoint")
        if "ref" not in extra and "ref_model" not in extra:  # saved without a reference
            self.ref_model = None
        elif self.group is not None:  # sharded in on_group; an older checkpoint holds it whole
            if "ref_model" in extra and self.ref_model is not None:
                self.group.load_full_state_dict(self.ref_model, extra["ref_model"])
        elif self.ref_source == "folder":
            with torch.random.fork_rng():  # leave the run's RNG, restored from the checkpoint, alone
                self.ref_model = build_policy_model(self.model_config, self.model_path, self.dtype)[0].eval()
            self.ref_model.requires_grad_(False)  # as frozen_copy leaves it, without copying a fresh model
        else:  # the checkpoint's weights are loaded into this copy next (or, older checkpoints, here)
            self.ref_model = frozen_copy(self.model)
            if "ref_model" in extra:
                self.ref_model.load_state_dict(extra["ref_model"])

    # -- hooks -------------------------------------------------------------------------------------------------

    def compute_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """Hook: one advantage per completion (flat, groups of ``group_size`` contiguous).

        Runs once per train step, before the loss; ``rewards`` are the reward actor's
        scores. Default: GRPO's group-centred (and, with ``normalize_std``, scaled) rewards.
        """
        return grpo_advantages(rewards, group_size, normalize_std=self.config.normalize_std)

    def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
        """Hook: the token-level loss, with the arguments of :func:`grpo_loss`
        (new log-probs, old log-probs, advantages, mask, then keywords); returns an object
        with ``.loss`` and ``.metrics()``. Runs ``update_epochs`` times per step."""
        return grpo_loss(*args, **kwargs)

    # -- on a trainer mesh (trainer.ranks > 1: rlmesh.rl.train.sharding, docs/trainer.md) ----------------------

    summed_metrics = frozenset({"train/groups", "train/tokens", "perf/train_tokens_per_s"})

    def shard_batch(self, batch: list[dict[str, Any]], world: int) -> list[list[dict[str, Any]]]:
        """Whole groups per rank: the informative groups one rank would train on, dealt evenly."""
        return split_groups(batch, world, self.compute_advantages, self.config.max_groups)

    def units_in(self, batch: list[dict[str, Any]]) -> float:
        """What this rank's loss averages over (:func:`batch_rows`): its trained tokens (or completions) of
        its informative groups with ``max_groups``, else of every completion it holds."""
        return grpo_units(batch, self.compute_advantages, self.config.aggregation,
                          informative_only=self.config.max_groups is not None)

    def on_group(self, group: Any) -> None:
        """Each rank's loss is scaled by its ``rank_weight``, so the gradient FSDP averages is the whole batch's.
        A KL reference copy (``kl_coef > 0`` without LoRA) is sharded like the policy: under FSDP2 each
        rank holds 1/N of it. Resuming, it is built here and its checkpointed weights loaded into it."""
        self.compute_loss = RankWeightedLoss(self.compute_loss, lambda: self.rank_weight)  # type: ignore[method-assign]
        if self.config.kl_coef > 0 and self.lora is None:
            ref = self.ref_model if self.ref_model is not None else frozen_copy(self.model)
            self.ref_model = group.shard_frozen(ref, self.config.parallel)

    # -- the step ----------------------------------------------------------------------------------------------

    def train_step(self, batch: list[dict[str, Any]]) -> dict[str, float]:
        t0 = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(self.step)
        group_size = batch[0]["group_size"]
        if any(item["group_size"] != group_size for item in batch):
            raise ValueError("GRPOTrainer: every work item of a batch must use the same samples_per_prompt")
        rows = [c for item in batch for c in item["completions"]]
        gen = completions_to_generation(rows, self.pad_id)
        rewards = torch.tensor([r for item in batch for r in item["rewards"]], dtype=torch.float32)
        if not all(item.get("logprobs_exact", True) for item in batch):
            with torch.no_grad():  # the backend's log-probs differ from ours: recompute behaviour log-probs
                gen.completion_logprobs = sequence_logprobs(self.model, gen.input_ids, gen.attention_mask,
                                                            gen.prompt_len, self.temperature) * gen.completion_mask
        scored = ScoredBatch([], gen, rewards, [c.text for c in rows])
        metrics = grpo_update(self.model, self.optimizer, scored, self.config, group_size, self.temperature,
                              ref_model=self.ref_model, max_groups=self.config.max_groups,
                              advantages=self.compute_advantages(rewards, group_size), loss_fn=self.compute_loss)
        metrics["rollout/reward_mean"] = float(rewards.mean())
        metrics["perf/train_tokens_per_s"] = metrics.get("train/tokens", 0.0) / max(time.perf_counter() - t0, 1e-9)
        return metrics
