"""The recipe layer, above ``rlmesh.rl``: composing a complete experiment's config with Hydra
(:mod:`~rlmesh.recipes.compose`, :mod:`~rlmesh.recipes.config_store`), the recipe-level schemas
(:mod:`~rlmesh.recipes.recipe_config`), the ``rlmesh run`` command (:mod:`~rlmesh.recipes.cli`)
and a run's identity on disk, so a run whose controller died can be resumed
(:mod:`~rlmesh.recipes.run_state`). Nothing below this package imports it.

The stable entry point for other tools (``rlmesh k8s render recipe=...``, scripts, notebooks)
is :func:`compose_recipe`: overrides in, validated config and launcher name out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["RecipeConfigError", "compose_recipe"]


def compose_recipe(overrides: list[str]) -> tuple[Any, str]:
    """Compose and validate a recipe config exactly as ``rlmesh run`` does: ``(config dataclass,
    launcher name)``. Raises :class:`RecipeConfigError` (one line naming the key and the fix) for a
    config that cannot run. A stable name: tools above the recipe layer call this, not ``compose``."""
    from rlmesh.recipes import compose as composition  # deferred: Hydra (~0.3 s), see __getattr__

    return composition.compose(overrides)


def __getattr__(name: str) -> Any:
    """``RecipeConfigError`` on first use. Why lazily: importing this package must not import Hydra,
    so that ``rlmesh run`` (:mod:`rlmesh.recipes.cli`) starts its procs' template ~0.3 s sooner."""
    if name == "RecipeConfigError":
        from rlmesh.recipes.compose import RecipeConfigError  # deferred: Hydra, as above

        return RecipeConfigError
    raise AttributeError(f"module 'rlmesh.recipes' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from rlmesh.recipes.compose import RecipeConfigError
