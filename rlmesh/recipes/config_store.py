"""Registers the recipe schemas in Hydra's ConfigStore, so YAML presets are typed.

``schema/ppo`` and ``schema/grpo`` are :class:`~rlmesh.recipes.recipe_config.PPORecipeConfig`
and :class:`~rlmesh.recipes.recipe_config.GRPORecipeConfig`, stored at the root package; a
recipe YAML lists one first in its defaults, and everything merged after it is checked
against the dataclasses (unknown key, wrong type) while Hydra composes.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from rlmesh.recipes.recipe_config import GRPORecipeConfig, PPORecipeConfig

SCHEMAS = {"ppo": PPORecipeConfig, "grpo": GRPORecipeConfig}


def register() -> ConfigStore:
    """Idempotent: store every schema (under group ``schema``, package ``_global_``)."""
    cs = ConfigStore.instance()
    for name, node in SCHEMAS.items():
        cs.store(group="schema", name=name, node=node, package="_global_")
    return cs
