"""The ``torch`` generation backend: the KV-cache sampler of :mod:`rlmesh.rl.models.sampling`
over the small built-in transformer, or over a local Hugging Face folder (``load_hf``).

It runs anywhere torch runs (CPU here). Its log-probs are exact in the sense of
:mod:`rlmesh.rl.backends.base` (``softmax(logits / T)`` before top-p), so the trainer uses
them as the behaviour log-probs directly. Weights are updated in place:
:meth:`weight_target` is the live ``state_dict``, which ``Subscriber.pull_into``
overwrites tensor by tensor, with no reallocation and no engine restart.

Threads follow the free CPUs (:class:`CpuShare`): an actor proc starts on one torch thread, so a
generator and a trainer on a 2-core host each hold one core; while the trainer waits for a batch its
core is idle, and sampling takes it (two threads) until the trainer's next step starts.

Prefix caching (the built-in transformer only): the keys and values of every context it sampled
from are kept (:mod:`rlmesh.rl.models.prefix_cache`), so a multi-turn episode's next turn reads
only its new tokens, not its whole context again. Any weight change empties the cache.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import torch
from torch import nn

from rlmesh.rl.backends.base import Completion, SamplingParams
from rlmesh.rl.models import prefix_cache
from rlmesh.rl.models.hf import adapter_state_dict, apply_lora, is_lora, load_hf
from rlmesh.rl.models.sampling import generate
from rlmesh.rl.models.transformer import Transformer, TransformerConfig

logger = logging.getLogger(__name__)


def threads_for(cpus: int, busy_s: float, own_s: float, wall_s: float, max_threads: int) -> int:
    """Torch threads for a process that used ``own_s`` CPU seconds of the ``busy_s`` its ``cpus`` CPUs
    were busy over ``wall_s``: the CPUs the other processes leave, at least 1, at most ``max_threads``.
    A quarter CPU of slack: another proc's housekeeping (heartbeats, telemetry) is not a core's work."""
    others = max(0.0, busy_s - own_s) / max(wall_s, 1e-9)
    return max(1, min(max_threads, math.floor(cpus - others + 0.25)))


class CpuShare:
    """Sets this process's torch threads to the CPUs of its affinity set that other processes leave free.

    Why: every actor proc runs one torch thread so that generation and training overlap on separate
    cores; but a trainer (or evaluator) that waits leaves its core idle, and a sampler bound by
    matrix products runs ~1.7x faster on two threads than on one. :meth:`start` begins a sampling
    call on one thread; :meth:`update`, called between decoding steps, measures over the last
    ``interval_s`` how busy the set's CPUs were (``/proc/stat``) less this process's own CPU time, and
    sets ``torch.set_num_threads`` to what :func:`threads_for` says. A host that others load keeps it at
    one thread: nothing is oversubscribed. Where ``/proc/stat`` cannot be read (not Linux) or the set
    has one CPU, the thread count is left as it is.
    """

    def __init__(self, max_threads: int | None = None, interval_s: float = 0.5) -> None:
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.max_threads = min(max_threads or len(self.cpus) or 1, max(len(self.cpus), 1))
        self.interval_s = interval_s
        self.threads = torch.get_num_threads()
        self.changes = 0
        """How many times the thread count changed."""
        self._tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self._last = self.sample()

    def sample(self) -> tuple[float, float, float] | None:
        """``(wall, busy seconds of the set's CPUs, this process's CPU seconds)``, or ``None``."""
        try:
            with open("/proc/stat") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        wanted, busy = {f"cpu{c}" for c in self.cpus}, 0
        for line in lines:
            name, _, rest = line.partition(" ")
            if name in wanted:
                ticks = [int(x) for x in rest.split()]
                busy += sum(ticks[:8]) - ticks[3] - ticks[4]  # user..steal, less idle and iowait
        return time.monotonic(), busy * self._tick, time.process_time()

    def start(self) -> None:
        """A sampling call begins: one thread, and a fresh measuring window. The trainer often starts
        its step just as a batch is handed over, so a call does not inherit the last call's threads."""
        if self.max_threads > 1:
            self._set(1)
            self._last = self.sample()

    def update(self) -> int:
        """Re-measure if ``interval_s`` has passed, set the thread count; returns it."""
        if self._last is None or self.max_threads <= 1 or time.monotonic() - self._last[0] < self.interval_s:
            return self.threads
        now = self.sample()
        if now is None:
            return self.threads
        wall, busy, own = (b - a for a, b in zip(self._last, now))
        self._last = now
        self._set(threads_for(len(self.cpus), busy, own, wall, self.max_threads))
        return self.threads

    def _set(self, threads: int) -> None:
        if threads != self.threads:
            torch.set_num_threads(threads)
            self.threads, self.changes = threads, self.changes + 1


def build_policy_model(model_config: TransformerConfig | dict[str, Any] | None = None,
                       model_path: str | None = None, dtype: str = "float32", lora: Any = None) -> tuple[nn.Module, Any]:
    """The policy network a trainer and a torch backend share: ``(model, tokenizer_or_None)``.

    ``model_path`` (a local ``save_pretrained`` folder, loaded in ``dtype``, with LoRA adapters when
    ``lora.r > 0``) wins over ``model_config``.
    """
    if model_path:
        model, tok = load_hf(model_path, dtype=getattr(torch, dtype))
        if lora is not None and lora.r > 0:
            model = apply_lora(model, lora)
        return model, tok
    if isinstance(model_config, dict):
        model_config = TransformerConfig(**model_config)
    return Transformer(model_config or TransformerConfig()), None


class TorchBackend:
    """Sampling with the in-process torch model.

    Args:
        model: an existing model (tests, notebooks); else one is built from
            ``model_config`` / ``model_path`` by :func:`build_policy_model`.
        eos_id: stop token; ``pad_id`` fills finished rows (both default to ``tokenizer``'s).
        tokenizer: decodes each completion's ``text`` (the model folder's own when none is given).
        seed: seeds the sampler's own ``torch.Generator`` (``SamplingParams.seed`` overrides it per call).
        prefix_cache_mb: memory for the keys and values of contexts already read (0: no prefix cache).
        threads: torch threads while sampling; ``None`` follows the CPUs other processes leave free
            (:class:`CpuShare`), an int pins it.
    """

    name = "torch"
    logprobs_exact = True

    def __init__(self, model: nn.Module | None = None, *, model_config: TransformerConfig | dict[str, Any] | None = None,
                 model_path: str | None = None, eos_id: int | None = None, pad_id: int | None = None, seed: int = 0,
                 tokenizer: Any = None, prefix_cache_mb: int = 256, dtype: str = "float32", lora: Any = None,
                 threads: int | None = None) -> None:
        if model is None:
            model, hf_tok = build_policy_model(model_config, model_path, dtype, lora)
            tokenizer = tokenizer or hf_tok
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        if eos_id is None and tokenizer is not None:
            eos_id = tokenizer.eos_id
        if pad_id is None:
            pad_id = tokenizer.pad_id if tokenizer is not None else 0
        self.eos_id, self.pad_id = eos_id, pad_id
        self._rng = torch.Generator().manual_seed(seed)
        self.threads = threads
        self.cpu_share: CpuShare | None = None
        """Made on the first call (in the proc that samples: a backend built elsewhere may travel)."""
        self.prefixes = (prefix_cache.PrefixCache(self.model, prefix_cache_mb << 20)
                         if prefix_cache_mb > 0 and isinstance(self.model, Transformer) else None)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions per prompt; tokens up to and including EOS, log-probs alongside."""
        rng = torch.Generator().manual_seed(params.seed) if params.seed is not None else self._rng
        cached = self.prefixes.lookup(prompts) if self.prefixes is not None else None
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        else:
            self.cpu_share = self.cpu_share or CpuShare()
            self.cpu_share.start()
        gen = generate(self.model, prompts, n=params.n, max_new_tokens=params.max_tokens,
                       temperature=params.temperature, top_p=params.top_p, eos_id=self.eos_id, pad_id=self.pad_id,
                       generator=rng, stop_ids=tuple(params.stop_token_ids), prefixes=cached,
                       keep_cache=self.prefixes is not None,
                       on_step=self.cpu_share.update if self.cpu_share is not None else None)
        if self.prefixes is not None:
            self.prefixes.store(gen.cache, gen.input_ids, gen.attention_mask)
            gen.cache = None
        lengths = gen.completion_mask.sum(1).tolist()
        ids, logps = gen.completion_ids.tolist(), gen.completion_logprobs.tolist()
        out: list[list[Completion]] = []
        for i, prompt in enumerate(prompts):
            group = []
            for j in range(params.n):
                r = i * params.n + j
                toks = ids[r][:lengths[r]]
                stop = bool(toks) and (toks[-1] == self.eos_id or toks[-1] in params.stop_token_ids)
                text = self._decode(toks)
                group.append(Completion(list(prompt), toks, logps[r][:lengths[r]], text, "stop" if stop else "length"))
            out.append(group)
        return out

    def _decode(self, toks: list[int]) -> str:
        return self.tokenizer.decode(toks) if self.tokenizer is not None else ""

    def weight_target(self) -> dict[str, Any]:
        """The live state_dict: ``pull_into`` copies new weights straight into the model's tensors
        (with LoRA, the adapters only: what the trainer publishes)."""
        return adapter_state_dict(self.model) if is_lora(self.model) else self.model.state_dict()

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Copy a whole state dict (with LoRA, the adapters') in place (for callers that hold tensors)."""
        self.model.load_state_dict(state_dict, strict=not is_lora(self.model))

    def close(self) -> None:
        """Nothing to release: the model lives in this process."""
