"""Policies: an MLP actor-critic for gymnasium spaces, a small decoder-only transformer
with KV-cache sampling, and a Hugging Face adapter (:mod:`rlmesh.rl.models.hf`, imported
on demand so ``transformers`` stays optional)."""

from rlmesh.rl.models.mlp import ActorCritic, ActorCriticConfig
from rlmesh.rl.models.sampling import Generation, generate, sequence_logprobs, top_p_filter
from rlmesh.rl.models.transformer import KVCache, Transformer, TransformerConfig

__all__ = [
    "ActorCritic",
    "ActorCriticConfig",
    "Generation",
    "KVCache",
    "Transformer",
    "TransformerConfig",
    "generate",
    "sequence_logprobs",
    "top_p_filter",
]
