"""What replacing a recipe's trainer preset resets, said in one line.

A recipe names a tuned trainer preset (``recipe/ppo_cartpole.yaml``: ``/trainer: ppo_cartpole``, with
lr 0.002, total_steps 100k, gamma 0.98, ...). Choosing another trainer config, with
``override /trainer: my_algo`` in a recipe of your own (docs/extending.md) or ``trainer=my_algo`` on the
command line, selects that config *instead*: Hydra composes its class defaults (lr 2.5e-4, total_steps 1M,
gamma 0.99, ...), not the preset's values. Keeping the preset's values silently would be wrong as often as
right (A2C after PPO must not inherit PPO's 10 update epochs), so rlmesh keeps Hydra's rule and says, in
one line on stderr before anything runs, which of the preset's values the new config puts back to its
class defaults. A variant compared against the preset is then compared knowingly: set the values it
should share in its YAML (or on the command line) and the line goes away.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path
from typing import Any, Callable

import yaml
from omegaconf import OmegaConf

GROUP = "trainer"
"""The role whose presets carry a recipe's tuning (and its budget: ``total_steps``)."""


def reset_note(cfg: Any, overrides: list[str], compose_raw: Callable[[list[str]], Any]) -> str | None:
    """One line naming the preset values that composing ``overrides`` (to ``cfg``, the hydra node
    included) put back to the chosen trainer class's defaults; ``None`` if the recipe's own trainer
    preset was kept, or nothing of it was reset. ``compose_raw`` composes other overrides the same way."""
    chosen = cfg.hydra.runtime.choices.get(GROUP)
    found = preset_of(str(cfg.hydra.runtime.choices.get("recipe")), cfg.hydra.runtime.config_sources)
    if not chosen or found is None or found[0] == chosen:
        return None
    preset, recipe = found
    searchpath = [o for o in overrides if o.startswith("hydra.searchpath=")]
    try:
        ref = compose_raw([f"recipe={recipe}", *searchpath])
        now = OmegaConf.to_container(cfg[GROUP], resolve=True)
        was = OmegaConf.to_container(ref[GROUP], resolve=True)
        cls = OmegaConf.get_type(cfg, GROUP)
    except Exception:  # noqa: BLE001 - only a note: never the reason a run does not start
        return None
    assert isinstance(now, dict) and isinstance(was, dict)
    defaults = _class_defaults(cls)
    on_command_line = {o.split("=", 1)[0].lstrip("+~").removeprefix(f"{GROUP}.") for o in overrides}
    reset = [f"{k} {was[k]} -> {v}" for k, v in now.items()
             if k != "_target_" and k in was and was[k] != v and k in defaults and defaults[k] == v
             and k not in on_command_line]
    if not reset:
        return None
    return (f"{GROUP}={chosen} replaces recipe {recipe}'s {GROUP}={preset} and resets {len(reset)} of its values "
            f"to {getattr(cls, '__name__', chosen)}'s defaults: {', '.join(reset)} (set them in your recipe or on the command line to keep them)")


def _class_defaults(cls: Any) -> dict[str, Any]:
    if not dataclasses.is_dataclass(cls):
        return {}
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def preset_of(recipe: str, sources: Any) -> tuple[str, str] | None:
    """``(trainer preset, recipe that names it)``: the first ``/trainer: X`` (not an ``override``) in the
    defaults of ``recipe/<recipe>.yaml`` and of the recipes it extends, depth first, as Hydra reads them."""
    roots = config_roots(sources)

    def load(path: str) -> dict[str, Any] | None:
        for root in roots:
            f = root / f"{path}.yaml"
            try:
                if f.is_file():
                    doc = yaml.safe_load(f.read_text())
                    return doc if isinstance(doc, dict) else {}
            except (OSError, yaml.YAMLError):
                return None
        return None

    def walk(path: str, depth: int) -> tuple[str, str] | None:
        doc = load(path) if depth < 16 else None
        if doc is None:
            return None
        here = path.rpartition("/")[0]
        for d in doc.get("defaults") or []:
            if isinstance(d, str) and d != "_self_":
                sub = walk(d.lstrip("/") if d.startswith("/") else f"{here}/{d}".lstrip("/"), depth + 1)
                if sub:
                    return sub
            elif isinstance(d, dict):
                for k, v in d.items():
                    k = str(k).strip()
                    key = k[1:] if k.startswith("/") else f"{here}/{k}".lstrip("/")
                    if key.split("@")[0] == GROUP and isinstance(v, str) and here == "recipe":
                        return v, path.removeprefix("recipe/")
        return None

    return walk(f"recipe/{recipe}", 0)


def config_roots(sources: Any) -> list[Any]:
    """The config search path's folders (``file://`` and ``pkg://``; Hydra's own left out)."""
    roots: list[Any] = []
    for s in sources or []:
        try:
            if s.schema == "file":
                roots.append(Path(s.path))
            elif s.schema == "pkg" and s.provider != "hydra":
                roots.append(importlib.resources.files(s.path.replace("/", ".")))
        except Exception:  # noqa: BLE001 - a folder that cannot be read is not searched
            continue
    return roots
