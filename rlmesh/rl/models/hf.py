"""Load a local Hugging Face causal LM folder and drive it with rlmesh's sampler.

:class:`HFCausalLM` adapts any ``AutoModelForCausalLM`` to the ``new_cache`` /
``forward(input_ids, attention_mask, cache)`` convention of
:class:`~rlmesh.rl.models.transformer.Transformer`, so
:func:`~rlmesh.rl.models.sampling.generate` and
:func:`~rlmesh.rl.models.sampling.sequence_logprobs` (and therefore the GRPO maths)
work unchanged on a real checkpoint. ``transformers`` is imported only here.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from torch import nn


def _require_transformers() -> Any:
    try:
        import transformers  # deferred: optional transformers (rlmesh[hf]), loaded only for a model folder
    except ImportError as exc:
        raise ImportError(
            "rlmesh.rl.models.hf needs transformers: pip install transformers "
            "(CPU installs: keep torch==2.13.0+cpu, transformers pulls no torch)"
        ) from exc
    return transformers


class _HFCache:
    """The model's own ``past_key_values`` plus the column count the sampler reads."""

    def __init__(self) -> None:
        self.past: Any = None
        self.length = 0


class HFCausalLM(nn.Module):
    """Wraps a Hugging Face causal LM; positions come from the attention mask (left padding)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        # transformers >= 5.2x renamed ``past_key_values`` to ``cache``; accept both.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def new_cache(self, batch: int, max_len: int | None = None) -> _HFCache:  # noqa: ARG002 (dynamic cache)
        return _HFCache()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache: _HFCache | None = None
    ) -> torch.Tensor:
        start = cache.length if cache is not None else 0
        total = start + input_ids.shape[1]
        if attention_mask is None:
            attention_mask = torch.ones(input_ids.shape[0], total, dtype=torch.long, device=input_ids.device)
        positions = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, start:total]
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=cache is not None,
            **{self._cache_kwarg: cache.past if cache is not None else None},
        )
        if cache is not None:
            new_past = getattr(out, "cache", None)
            cache.past = new_past if new_past is not None else out.past_key_values
            cache.length = total
        return out.logits


def load_hf(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple[HFCausalLM, Any]:
    """Load ``path`` (a local folder written by ``save_pretrained``) as ``(model, tokenizer)``.

    The tokenizer is ``None`` when the folder has none (e.g. a random-weight test model
    used with :class:`~rlmesh.rl.tasks.CharTokenizer`). Nothing is downloaded:
    ``local_files_only=True``.
    """
    transformers = _require_transformers()
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"load_hf: {path} has no config.json; pass a folder written by save_pretrained")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).to(device)
    tokenizer = None
    if any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    return HFCausalLM(model.eval()), tokenizer
