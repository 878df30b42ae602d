"""The ``torch`` generation backend: the KV-cache sampler of :mod:`rlmesh.rl.models.sampling`
over the small built-in transformer, or over a local Hugging Face folder (``load_hf``).

It runs anywhere torch runs (CPU here). Its log-probs are exact in the sense of
:mod:`rlmesh.rl.backends.base` (``softmax(logits / T)`` before top-p), so the trainer uses
them as the behaviour log-probs directly. Weights are updated in place:
:meth:`weight_target` is the live ``state_dict``, which ``Subscriber.pull_into``
overwrites tensor by tensor, with no reallocation and no engine restart.

Prefix caching (the built-in transformer only): the keys and values of every context it sampled
from are kept (:mod:`rlmesh.rl.models.prefix_cache`), so a multi-turn episode's next turn reads
only its new tokens, not its whole context again. Any weight change empties the cache.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from rlmesh.rl.backends.base import Completion, SamplingParams
from rlmesh.rl.models import prefix_cache
from rlmesh.rl.models.hf import adapter_state_dict, apply_lora, is_lora, load_hf
from rlmesh.rl.models.sampling import generate
from rlmesh.rl.models.transformer import Transformer, TransformerConfig

logger = logging.getLogger(__name__)


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
    """

    name = "torch"
    logprobs_exact = True

    def __init__(self, model: nn.Module | None = None, *, model_config: TransformerConfig | dict[str, Any] | None = None,
                 model_path: str | None = None, eos_id: int | None = None, pad_id: int | None = None, seed: int = 0,
                 tokenizer: Any = None, prefix_cache_mb: int = 256, dtype: str = "float32", lora: Any = None) -> None:
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
        self.prefixes = (prefix_cache.PrefixCache(self.model, prefix_cache_mb << 20)
                         if prefix_cache_mb > 0 and isinstance(self.model, Transformer) else None)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions per prompt; tokens up to and including EOS, log-probs alongside."""
        rng = torch.Generator().manual_seed(params.seed) if params.seed is not None else self._rng
        cached = self.prefixes.lookup(prompts) if self.prefixes is not None else None
        gen = generate(self.model, prompts, n=params.n, max_new_tokens=params.max_tokens,
                       temperature=params.temperature, top_p=params.top_p, eos_id=self.eos_id, pad_id=self.pad_id,
                       generator=rng, stop_ids=tuple(params.stop_token_ids), prefixes=cached,
                       keep_cache=self.prefixes is not None)
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
