"""Tuned presets per environment: ``rlmesh run recipe=ppo generator.env_id=X`` runs ``recipe/ppo/X.yaml``.

Why: an algorithm's defaults suit few environments (PPO's learn CartPole, not LunarLander), and the
published tuned values (rl-baselines3-zoo, CleanRL) are what users compare against. So a recipe named
after an algorithm, ``recipe/<algo>.yaml`` (the algorithm with its config class's defaults), may have a
folder beside it, ``recipe/<algo>/``, with one preset per gymnasium id (``recipe/ppo/LunarLander-v3.yaml``).
Each preset extends ``/recipe/<algo>``, sets the tuned values, and names where they come from on a
``# source: <who>, <where>`` comment line.

When ``rlmesh run recipe=<algo>`` composes, the env the config steps (``generator.env_id``, from the
command line or the recipe) is looked up in that folder:

- a preset exists: the run uses it (``recipe=<algo>/<env>``, the other overrides on top) and says so in
  one line, ``rlmesh: using preset ppo/LunarLander-v3 from rl-baselines3-zoo``;
- none exists: the run keeps the algorithm's defaults and says that in one line, naming the envs that
  have presets.

``recipe=ppo/LunarLander-v3`` names a preset directly. Another algorithm's presets plug in with the same
two things (``recipe/sac.yaml``, ``recipe/sac/Pendulum-v1.yaml``), shipped or in a folder on
``hydra.searchpath``; nothing here lists the algorithms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from rlmesh.recipes.presets import config_roots

SOURCE_TAG = "# source:"
"""The comment line of a preset file that names where its values come from."""


@dataclass(frozen=True)
class EnvPreset:
    """One tuned preset: ``recipe/<algo>/<env_id>.yaml``."""

    algo: str
    env_id: str
    source: str
    """Who published the values (``rl-baselines3-zoo``): the ``# source:`` line up to its first comma."""

    @property
    def recipe(self) -> str:
        """The recipe name that selects it (``recipe=ppo/LunarLander-v3``)."""
        return f"{self.algo}/{self.env_id}"


@dataclass(frozen=True)
class PresetChoice:
    """What composing ``recipe=<algo>`` decided: the overrides to compose, and the line that says why."""

    overrides: list[str]
    note: str
    preset: EnvPreset | None


def source_of(text: str) -> str:
    """The publisher named on a preset file's ``# source:`` line (before its first comma); ``""`` if none."""
    for line in text.splitlines():
        if line.startswith(SOURCE_TAG):
            return line[len(SOURCE_TAG):].split(",", 1)[0].strip()
    return ""


def env_presets(algo: str, sources: Any) -> dict[str, EnvPreset] | None:
    """The presets of ``recipe/<algo>/`` by env id over the config search path (earlier folders win);
    ``None`` when no folder on it has such a directory (``algo`` is not an algorithm-only recipe)."""
    found: dict[str, EnvPreset] | None = None
    for root in config_roots(sources):
        folder = root / "recipe" / algo
        try:
            if not folder.is_dir():
                continue
            files = sorted(folder.iterdir(), key=lambda f: f.name)
        except OSError:  # a folder that cannot be read is not searched
            continue
        found = {} if found is None else found
        for f in files:
            if f.name.endswith(".yaml") and f.name[:-5] not in found:
                found[f.name[:-5]] = EnvPreset(algo, f.name[:-5], source_of(f.read_text()))
    return found


def choose_preset(cfg: Any, overrides: list[str]) -> PresetChoice | None:
    """For a config composed (hydra node included) from ``overrides`` with an algorithm-only recipe: the
    overrides that select its tuned preset for the env, or the same overrides when there is none, with
    the one line to print. ``None`` when the recipe is not algorithm-only (or was not chosen with
    ``recipe=``)."""
    recipe = str(cfg.hydra.runtime.choices.get("recipe"))
    if f"recipe={recipe}" not in overrides:
        return None
    presets = env_presets(recipe, cfg.hydra.runtime.config_sources)
    if presets is None:
        return None
    env_id = str(OmegaConf.select(cfg, "generator.env_id"))
    preset = presets.get(env_id)
    if preset is None:
        cls = OmegaConf.get_type(cfg, "trainer")
        tuned = ", ".join(presets) or "none"
        return PresetChoice(overrides, f"no tuned preset {recipe}/{env_id} (presets for {recipe}: {tuned}); running "
                            f"with {getattr(cls, '__name__', recipe)}'s defaults", None)
    chosen = [f"recipe={preset.recipe}" if o == f"recipe={recipe}" else o for o in overrides]
    return PresetChoice(chosen, f"using preset {preset.recipe} from {preset.source or 'an unnamed source'}", preset)
