"""Batched sampling of N completions per prompt with a KV cache, and the matching
full-sequence log-probs for training.

Log-prob convention (what GRPO's importance ratio needs): a token's log-prob is taken
under ``softmax(logits / temperature)`` *before* top-p truncation, and
:func:`sequence_logprobs` computes exactly that from a full forward pass. The trainer
and the generator therefore agree to float precision when they hold the same weights
(tested), and top-p only changes *which* tokens are drawn, not how they are scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from rlmesh.rl.models import prefix_cache


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask (to -inf) every token outside the nucleus: the smallest set of most likely
    tokens whose probability sums to at least ``top_p``. The top token always stays."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` ``[R, V]``, by inverse CDF: one uniform number per row against
    the row's cumulative sum (float64), so a token of probability 0 is never drawn.

    Why not ``torch.multinomial``: for one draw it makes a random number per vocabulary entry; at
    SmolLM2's 49k tokens and 32 rows that was ~40 ms of CPU a decoding step (a tenth of the step),
    this is ~7 ms. Same distribution, another random stream.
    """
    cdf = probs.double().cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_max(probs.shape[-1] - 1).squeeze(-1)


@dataclass
class Generation:
    """``num_prompts * n`` rows, samples of a prompt contiguous (row ``i * n + j``)."""

    input_ids: torch.Tensor
    """[R, P + L] left-padded prompt then completion (padding after EOS is ``pad_id``)."""
    attention_mask: torch.Tensor
    """[R, P + L] 1 on real prompt tokens and on completion tokens up to and including EOS."""
    completion_ids: torch.Tensor
    """[R, L] sampled tokens."""
    completion_logprobs: torch.Tensor
    """[R, L] log-prob of each sampled token (see module doc), 0 where masked."""
    completion_mask: torch.Tensor
    """[R, L] 1 up to and including the first EOS."""
    prompt_len: int
    """P, the padded prompt width; completions start at this column."""
    loss_mask: torch.Tensor | None = None
    """[R, L] 1 on tokens the policy sampled, 0 on tokens it only read (tool observations of a
    multi-turn episode); ``None``: every completion token is the policy's (``completion_mask``)."""
    cache: Any = None
    """The KV cache the sampler filled (``keep_cache=True``), for :func:`prefix_cache.extract`."""

    @property
    def trained_mask(self) -> torch.Tensor:
        """The tokens a loss counts: ``loss_mask`` where given, else ``completion_mask``."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    @property
    def num_tokens(self) -> int:
        """Completion tokens actually generated (masked ones excluded)."""
        return int(self.completion_mask.sum())


@torch.no_grad()
def generate(
    model: nn.Module,
    prompts: list[list[int]],
    n: int = 1,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    pad_id: int = 0,
    generator: torch.Generator | None = None,
    stop_ids: tuple[int, ...] = (),
    prefixes: list[prefix_cache.PrefixKV | None] | None = None,
    keep_cache: bool = False,
    on_step: Callable[[], Any] | None = None,
) -> Generation:
    """Sample ``n`` completions for each prompt (token-id lists) with incremental decoding.

    A row finishes at ``eos_id`` or at any of ``stop_ids`` (a tool-call stop token), which it keeps;
    the call returns early once every row has finished. ``model`` follows the
    ``new_cache`` / ``repeat_cache`` / ``forward(input_ids, attention_mask, cache, last_only)``
    convention of :class:`~rlmesh.rl.models.transformer.Transformer`: with ``n > 1`` each prompt is
    read once and its cache repeated for its ``n`` samples, and only the last column's logits are made.

    ``prefixes`` (one per prompt, or ``None``) hold keys and values of each prompt's first tokens
    from an earlier call (:class:`~rlmesh.rl.models.prefix_cache.PrefixCache`): only the rest is
    read. ``keep_cache`` returns the filled cache in :attr:`Generation.cache`. ``on_step`` runs before
    each decoding step (the torch backend sets its thread count there: :class:`~rlmesh.rl.backends.torch_backend.CpuShare`).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature}); use a small top_p for near-greedy decoding")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate: every prompt needs at least one token")
    device = next(model.parameters()).device
    rows = len(prompts) * n
    logprobs = torch.zeros(rows, max_new_tokens, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    stops = torch.tensor(sorted({*stop_ids, *(() if eos_id is None else (eos_id,))}), dtype=torch.long, device=device)
    cont = None
    if prefixes is not None and n == 1:
        max_seq_len = getattr(getattr(model, "config", None), "max_seq_len", 0)
        cont = prefix_cache.continue_in_place(prompts, prefixes, max_new_tokens, pad_id, max_seq_len)
    if cont is not None:  # the rows' last call's cache goes on: nothing to seed
        cache, input_ids, attention_mask, width = cont.cache, cont.input_ids, cont.attention_mask, cont.width
        logits = model(input_ids[:, cont.start:width], attention_mask[:, :width], cache, last_only=True)[:, -1]
    else:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((rows, width + max_new_tokens), pad_id, dtype=torch.long, device=device)
        attention_mask = torch.zeros_like(input_ids)
        for i, prompt in enumerate(prompts):
            sl = slice(i * n, (i + 1) * n)
            input_ids[sl, width - len(prompt):width] = torch.tensor(prompt, device=device)
            attention_mask[sl, width - len(prompt):width] = 1
        if prefixes is not None and any(p is not None for p in prefixes):
            cache = model.new_cache(rows, width + max_new_tokens)
            # read only the columns some row has not cached: each row's unread suffix ends at `width`
            unread = max(len(pr) - (len(pf.tokens) if pf is not None else 0) for pr, pf in zip(prompts, prefixes))
            start = width - unread
            prefix_cache.seed(cache, [pf for pf in prefixes for _ in range(n)],
                              [len(pr) for pr in prompts for _ in range(n)], width, start)
            logits = model(input_ids[:, start:width], attention_mask[:, :width], cache, last_only=True)[:, -1]
        else:
            # A group's samples share their prompt: it is read once (rows i * n) and its keys and
            # values copied to the group's n rows. Reading it n times was a quarter of a GSM8K
            # work item's sampling (8 prompts x 4 samples, ~64-token prompts, 48 new tokens).
            cache = model.new_cache(len(prompts), width + max_new_tokens)
            logits = model(input_ids[::n, :width], attention_mask[::n, :width], cache, last_only=True)[:, -1]
            if n > 1:
                cache, logits = model.repeat_cache(cache, n), logits.repeat_interleave(n, 0)
    steps = 0
    for t in range(max_new_tokens):
        scaled = logits.float() / temperature
        logp = scaled.log_softmax(-1)
        top = logp.max(-1) if top_p < 1.0 else None
        if top is not None and bool((top.values >= math.log(top_p)).all()):
            # every row's nucleus is its top token alone (greedy evaluation asks top_p=1e-9): the
            # draw is the argmax, with no vocabulary-wide sort or random draw
            token = top.indices
        else:
            token = draw(top_p_filter(scaled, top_p).softmax(-1), generator)
        token_logp = logp.gather(-1, token[:, None]).squeeze(-1)
        live = ~finished
        col = width + t
        input_ids[:, col] = torch.where(live, token, pad_id)
        attention_mask[:, col] = live.long()
        logprobs[:, t] = torch.where(live, token_logp, 0.0)
        steps = t + 1
        if stops.numel():
            finished |= torch.isin(token, stops)
        if bool(finished.all()) or t == max_new_tokens - 1:
            break
        # Finished rows still run (batch shape stays fixed) but are masked everywhere.
        if on_step is not None:
            on_step()
        logits = model(input_ids[:, col:col + 1], attention_mask[:, :col + 1], cache)[:, -1]
    input_ids, attention_mask = input_ids[:, :width + steps], attention_mask[:, :width + steps]
    return Generation(input_ids, attention_mask, input_ids[:, width:], logprobs[:, :steps],
                      attention_mask[:, width:], width, cache=cache if keep_cache else None)


def sequence_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probs ``[R, T - start]`` of tokens ``input_ids[:, start:]`` from one full forward pass.

    With gradients: this is what the GRPO trainer differentiates. ``start`` is
    :attr:`Generation.prompt_len`; mask the result with ``attention_mask[:, start:]``.
    """
    logits = model(input_ids, attention_mask)[:, start - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, input_ids[:, start:, None]).squeeze(-1)
