"""``rlmesh k8s`` at the recipe layer: the launcher's command, able to compose ``recipe=...``.

    rlmesh k8s render recipe=ppo_cartpole launcher=kubernetes launcher.image=ghcr.io/you/rlmesh:0.1 --mesh pods=3

Why here and not in :mod:`rlmesh.launch.kubernetes.cli`: rendering a recipe's pods means
composing the recipe exactly as ``rlmesh run`` would, and recipes sit above the launch layer.
So the launcher's command takes the composition as an argument and this module, which may
import both layers, supplies it (everything else about ``rlmesh k8s`` stays in ``launch/``).
"""

from __future__ import annotations

from typing import Any

from rlmesh.errors import ConfigError
from rlmesh.launch.kubernetes.cli import k8s_main as launcher_k8s_main
from rlmesh.recipes import RecipeConfigError, compose_recipe


def recipe_settings(overrides: list[str]) -> tuple[dict[str, Any], dict[str, int]]:
    """Compose a recipe as ``rlmesh run`` would: ``(launcher settings, proc meshes)``."""
    if "launcher=kubernetes" not in overrides:
        raise ConfigError("add launcher=kubernetes: rendering pods needs the kubernetes launcher group")
    try:
        cfg, launcher = compose_recipe(overrides)
    except RecipeConfigError as exc:
        raise ConfigError(str(exc)) from exc
    if launcher != "kubernetes":
        raise ConfigError(f"the recipe uses launcher={launcher}; add launcher=kubernetes to render pods")
    meshes = cfg.proc_meshes() if callable(getattr(cfg, "proc_meshes", None)) else {}
    return dict(cfg.launcher), dict(meshes)


def k8s_main(argv: list[str]) -> int:
    """Entry point of ``rlmesh k8s`` (see :func:`rlmesh.launch.kubernetes.cli.k8s_main`)."""
    return launcher_k8s_main(argv, recipe_settings=recipe_settings)
