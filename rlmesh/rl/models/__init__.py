"""Policies: an MLP actor-critic for gymnasium spaces, a small decoder-only transformer."""

from rlmesh.rl.models.mlp import ActorCritic, ActorCriticConfig
# from rlmesh.rl.models.transformer import Transformer, TransformerConfig, generate

__all__ = ["ActorCritic", "ActorCriticConfig", "Transformer", "TransformerConfig", "generate"]
