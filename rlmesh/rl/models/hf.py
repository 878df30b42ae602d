"""Load a local Hugging Face causal LM folder and drive it with rlmesh's sampler.

:class:`HFCausalLM` adapts any ``AutoModelForCausalLM`` to the ``new_cache`` /
``forward(input_ids, attention_mask, cache)`` convention of
:class:`~rlmesh.rl.models.transformer.Transformer`, so
:func:`~rlmesh.rl.models.sampling.generate` and
:func:`~rlmesh.rl.models.sampling.sequence_logprobs` (and therefore the GRPO maths)
work unchanged on a real checkpoint. ``transformers`` is imported only here.
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlmesh.rl.names import has_tokenizer


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

    def repeat_rows(self, n: int) -> None:
        """Each row ``n`` times over, in place (row ``i * n + j`` is row ``i``)."""
        if self.past is not None:
            self.past.batch_repeat_interleave(n)


class HFCausalLM(nn.Module):
    """Wraps a Hugging Face causal LM; positions come from the attention mask (left padding)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        # transformers >= 5.2x renamed ``past_key_values`` to ``cache``; accept both.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in params

    def gradient_checkpointing_enable(self) -> None:
        """Recompute each layer's activations in the backward pass instead of keeping them
        (``model.gradient_checkpointing``): less memory for long sequences, more compute."""
        self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def new_cache(self, batch: int, max_len: int | None = None) -> _HFCache:  # noqa: ARG002 (dynamic cache)
        return _HFCache()

    def repeat_cache(self, cache: _HFCache, n: int) -> _HFCache:
        """``cache`` with each row ``n`` times over (in place; the model's own cache repeats)."""
        cache.repeat_rows(n)
        return cache

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache: _HFCache | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits for ``input_ids`` (the last column's alone with ``last_only``: a prompt's other
        columns would cost a vocabulary-wide projection each for nothing)."""
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
            **({"logits_to_keep": 1} if last_only and self._keeps_logits else {}),
        )
        if cache is not None:
            new_past = getattr(out, "cache", None)
            cache.past = new_past if new_past is not None else out.past_key_values
            cache.length = total
        return out.logits[:, -1:] if last_only else out.logits


class HFTokenizer:
    """A model folder's tokenizer in the :class:`~rlmesh.rl.tasks.tokenizer.Tokenizer` contract.

    Prompts go through the folder's chat template (``add_generation_prompt``: the ids end where the
    assistant's answer starts); a folder without a template encodes the prompt as plain text.
    Decoding leaves special tokens out and stops at the first EOS, the same for every backend.

    It travels by path: pickled into another proc it is the folder's name, loaded there on first use
    (the tokenizer's files stay on disk; a controller that never renders a prompt never loads it).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._tok: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]  # unpickling re-runs this class's own __init__

    @property
    def hf(self) -> Any:
        """The ``transformers`` tokenizer itself (loaded on first use)."""
        if self._tok is None:
            self._tok = _require_transformers().AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        return self._tok

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def eos_id(self) -> int:
        eos = self.hf.eos_token_id
        if eos is None:
            raise ValueError(f"the tokenizer of {self.path} has no EOS token; generation could never stop")
        return int(eos)

    @property
    def pad_id(self) -> int:
        """The pad token, or EOS where the tokenizer has none (what chat models pad with)."""
        pad = self.hf.pad_token_id
        return int(pad) if pad is not None else self.eos_id

    @property
    def chat_template(self) -> str | None:
        return getattr(self.hf, "chat_template", None)

    def render(self, prompt: str, system: str | None = None) -> list[int]:
        if not self.chat_template:
            return list(self.hf.encode(prompt))
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        ids = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        eos = self.eos_id
        if eos in ids:
            ids = ids[:ids.index(eos)]
        return self.hf.decode(ids, skip_special_tokens=True)


def load_hf(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple[HFCausalLM, Any]:
    """Load ``path`` (a local folder written by ``save_pretrained``) as ``(model, tokenizer)``.

    The tokenizer (an :class:`HFTokenizer`) is ``None`` when the folder has none (e.g. a
    random-weight test model used with :class:`~rlmesh.rl.tasks.CharTokenizer`). Nothing is
    downloaded: ``local_files_only=True``.
    """
    transformers = _require_transformers()
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"load_hf: {path} has no config.json; pass a folder written by save_pretrained")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).to(device)
    return HFCausalLM(model.eval()), HFTokenizer(path) if has_tokenizer(path) else None


def apply_lora(model: HFCausalLM, lora: Any) -> HFCausalLM:
    """Give ``model`` LoRA adapters (``lora``: a :class:`~rlmesh.rl.config.LoRAConfig`) through ``peft``:
    the base weights are frozen and only the adapters train. The trainer and every generator apply
    the same adapters to the same folder, so the adapter tensors alone (:func:`adapter_state_dict`,
    a few MB) are what a weight version carries."""
    try:
        import peft  # deferred: optional peft (rlmesh[hf]), loaded only with model.lora.r > 0
    except ImportError as exc:
        raise ImportError("model.lora needs peft: pip install peft (or pip install -e '.[hf]')") from exc
    config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    model.model = peft.get_peft_model(model.model, config)
    return model


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` (an :class:`HFCausalLM`) carries LoRA adapters."""
    return hasattr(getattr(model, "model", None), "disable_adapter")


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors of a LoRA model under their state-dict names (the same names on the
    trainer and the generators, which wrap the same folder the same way): live tensors, so a
    subscriber's ``pull_into`` writes straight into the model's adapters."""
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


class BaseOf(nn.Module):
    """The model with its LoRA adapters switched off: the frozen reference policy of the KL term,
    without a second copy of the weights (the base weights are shared and never train)."""

    def __init__(self, model: HFCausalLM) -> None:
        super().__init__()
        self.lora = model

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with self.lora.model.disable_adapter():
            return self.lora(*args, **kwargs)


def save_folder(model: nn.Module, path: str | Path, tokenizer: Any = None) -> Path:
    """Write ``model`` (an :class:`HFCausalLM`) as a folder ``AutoModelForCausalLM.from_pretrained``
    loads, with ``tokenizer``'s files (chat template included) when given. LoRA adapters are merged
    into a copy of the weights first, so the folder is an ordinary model."""
    inner = model.model
    if is_lora(model):
        inner = copy.deepcopy(inner).merge_and_unload()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    inner.save_pretrained(out)
    if tokenizer is not None and hasattr(tokenizer, "hf"):
        tokenizer.hf.save_pretrained(out)
    return out
