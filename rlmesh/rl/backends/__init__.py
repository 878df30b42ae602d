"""Generation backends for ``LLMGenerator``: ``torch`` (the small transformer, CPU) and ``vllm``.

A backend samples N completions per prompt and takes new weights in place. Pick one
by name (``generator.backend=torch|vllm``); :func:`make_backend` imports it lazily so
``vllm`` is only needed where it is used.
"""

from rlmesh.rl.backends.base import BACKENDS, Completion, GenerationBackend, SamplingParams, make_backend

__all__ = ["BACKENDS", "Completion", "GenerationBackend", "SamplingParams", "make_backend"]
