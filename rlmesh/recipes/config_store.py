"""Registers every config dataclass in Hydra's ConfigStore, so choosing a config chooses a class.

Two kinds of entries:

- **Recipe schemas** (group ``schema``, package ``_global_``): ``schema/ppo`` and ``schema/grpo``
  are :class:`~rlmesh.recipes.recipe_config.PPORecipeConfig` and
  :class:`~rlmesh.recipes.recipe_config.GRPORecipeConfig`. A recipe YAML lists one first in its
  defaults; everything merged after it is checked against the dataclasses while Hydra composes.
  In the stored schema each role node (``trainer``, ``generator``, ...) has the *declared* type of
  its field, not the Python default's, so a role preset may bring any subclass of it.
- **Role configs** (groups ``trainer``, ``generator``, ``reward``, ``buffer``): one entry per
  config class, named after its algorithm or actor (``trainer/ppo`` is :class:`PPOConfig` with its
  defaults). ``trainer=ppo`` on the command line selects the class *and* its fields; a YAML preset
  extends one (``trainer/ppo_cartpole.yaml`` starts with ``defaults: [ppo, _self_]``). Each config
  names its actor class in ``_target_``, so the selection reaches the spawned actor too.

A user's package adds its own entries without editing rlmesh, through the entry point group
``rlmesh.algorithms`` (:data:`ENTRY_POINT_GROUP`): each entry point names a function that takes
the ConfigStore and stores configs in it (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import typing
from importlib.metadata import entry_points
from typing import Any, Callable

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from rlmesh import settings
from rlmesh.errors import ConfigError
from rlmesh.recipes.agentic_config import AgenticRecipeConfig
from rlmesh.recipes.recipe_config import GRPORecipeConfig, PPORecipeConfig
from rlmesh.rl.agentic.config import AgenticGeneratorConfig
from rlmesh.rl.algorithms.configs import builtin_modules
from rlmesh.rl.config import BufferConfig, GymGeneratorConfig, LLMGeneratorConfig, RewardConfig

logger = logging.getLogger(__name__)

SCHEMAS: dict[str, type] = {"ppo": PPORecipeConfig, "grpo": GRPORecipeConfig, "agentic": AgenticRecipeConfig}
"""Recipe schemas by program name (``schema/<name>``)."""

ROLE_CONFIGS: dict[str, dict[str, type]] = {
    "trainer": {},
    "generator": {"gym": GymGeneratorConfig, "llm": LLMGeneratorConfig, "agentic": AgenticGeneratorConfig},
    "reward": {"base": RewardConfig},
    "buffer": {"replay": BufferConfig},
}
"""The role config classes of rlmesh's actors, by group and name (``generator/gym``). Algorithms are not
listed: each built-in one registers itself from :mod:`rlmesh.rl.algorithms.configs` the way a plugin
does (``register(cs)``), and yours with :func:`store_role_config` from an ``rlmesh.algorithms`` entry point."""

ENTRY_POINT_GROUP = "rlmesh.algorithms"
"""Entry point group of algorithm plugins: each names ``register(cs: ConfigStore) -> None``."""
MODULES_ENV = settings.ALGORITHMS.name
"""Comma-separated modules (importable, e.g. through ``PYTHONPATH``) whose ``register(cs)`` is called
like an entry point's: algorithms from a folder that is not an installed package."""

_plugins_loaded = False


def store_role_config(cs: ConfigStore, group: str, name: str, node: type | Any) -> None:
    """Store config class (or instance) ``node`` as ``<group>/<name>``, e.g. ``trainer/rloo``.

    ``node`` should be a dataclass with a ``_target_`` naming its actor class; its fields are then
    settable on the command line (``trainer=rloo trainer.scale_by_std=true``)."""
    if group not in ROLE_CONFIGS:
        raise ConfigError(f"config group {group!r} is not a role: use one of {', '.join(ROLE_CONFIGS)}")
    cs.store(group=group, name=name, node=node)


def schema_node(schema: type) -> Any:
    """The recipe schema as Hydra stores it: role fields whose Python default is a subclass of the
    declared type are reset to the declared type (``PPORecipeConfig.trainer`` is declared
    :class:`~rlmesh.rl.config.GymTrainerConfig`, defaults to ``PPOConfig``), so a preset of a
    sibling class (A2C's config next to PPO's) merges in instead of being refused."""
    node = OmegaConf.structured(schema)
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        declared = hints.get(f.name)
        if f.name in ROLE_CONFIGS and dataclasses.is_dataclass(declared) and \
                OmegaConf.get_type(node, f.name) is not declared:
            node[f.name] = OmegaConf.structured(declared)
    return node


def register() -> ConfigStore:
    """Idempotent: store every schema and role config, then every built-in algorithm's configs (each
    config module's ``register(cs)``), then load the ``rlmesh.algorithms`` plugins, which call the same hook."""
    cs = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        cs.store(group="schema", name=name, node=schema_node(schema), package="_global_")
    for group, configs in ROLE_CONFIGS.items():
        for name, node in configs.items():
            store_role_config(cs, group, name, node)
    for module in builtin_modules():
        module.register(cs)
    load_plugins(cs)
    return cs


def load_plugins(cs: ConfigStore) -> list[str]:
    """Call every ``rlmesh.algorithms`` entry point, then every ``$RLMESH_ALGORITHMS`` module's
    ``register``, once per process; returns their names. A plugin that fails to load is a config
    error naming it (and the distribution it came from)."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    found: list[tuple[str, str, Callable[[], Any]]] = [
        (ep.name, f"{ENTRY_POINT_GROUP} entry point {ep.name} = {ep.value} (from {getattr(ep.dist, 'name', '?')})",
         ep.load) for ep in entry_points(group=ENTRY_POINT_GROUP)]
    found += [(m, f"{MODULES_ENV} module {m}", lambda m=m: importlib.import_module(m).register)  # type: ignore[misc]  # a lambda with a default argument (binds the loop's value): mypy cannot infer it
              for m in filter(None, (x.strip() for x in settings.ALGORITHMS.get().split(",")))]
    for name, what, load in found:
        try:
            load()(cs)
        except Exception as exc:  # noqa: BLE001 - any plugin failure becomes one line naming the plugin
            _plugins_loaded = False
            fix = f"uninstall {what.rsplit('(from ', 1)[1][:-1]}" if "(from " in what else f"unset {MODULES_ENV}"
            raise ConfigError(f"{what} failed: {type(exc).__name__}: {exc}; fix the plugin or {fix}") from exc
        logger.debug("loaded algorithm plugin %s", what)
    return [name for name, _, _ in found]


def role_types(cfg: Any) -> dict[str, str]:
    """``{role: "module.ConfigClass"}`` of a built recipe config's role nodes: what
    :mod:`rlmesh.recipes.run_state` saves so a resumed run rebuilds the same classes."""
    return {f.name: f"{type(v).__module__}.{type(v).__qualname__}" for f in dataclasses.fields(cfg)
            if f.name in ROLE_CONFIGS and dataclasses.is_dataclass(v := getattr(cfg, f.name))}
