"""The config dataclasses of the algorithms in :mod:`rlmesh.rl.algorithms`, one module each, kept apart from them.

Why apart: composing a recipe (``rlmesh run``, Hydra's ConfigStore) needs every config class, and importing
the algorithm modules would load torch and the actors (seconds) in the controller before anything runs.
These modules import only :mod:`rlmesh.rl.config`; each algorithm module re-exports its config, and each
config names its trainer in ``_target_``.

Each module here has ``register(cs)``, the hook an ``rlmesh.algorithms`` plugin has, and
:mod:`rlmesh.recipes.config_store` calls every one it finds in this package (:func:`builtin_modules`)
before the plugins'. A new built-in algorithm adds a module here and edits no list.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from rlmesh.rl.algorithms.configs.a2c import A2CConfig
from rlmesh.rl.algorithms.configs.dapo import DAPOConfig
from rlmesh.rl.algorithms.configs.dqn import DQNConfig
from rlmesh.rl.algorithms.configs.rloo import RLOOConfig
from rlmesh.rl.config import ReplayConfig

__all__ = ["A2CConfig", "DAPOConfig", "DQNConfig", "RLOOConfig", "ReplayConfig", "builtin_modules"]


def builtin_modules() -> list[ModuleType]:
    """Every config module of this package that has a ``register(cs)`` hook, by name."""
    found = [importlib.import_module(f"{__name__}.{m.name}") for m in sorted(pkgutil.iter_modules(__path__),
                                                                            key=lambda m: m.name)]
    return [m for m in found if callable(getattr(m, "register", None))]
