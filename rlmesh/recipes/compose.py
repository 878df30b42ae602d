"""Composing a recipe config with Hydra and validating it: what ``rlmesh run`` does before any
proc starts, and what a script (or ``rlmesh k8s render recipe=...``) calls to get the same config.

Everything that can be wrong with a config is found here, before any proc starts:
composition errors (unknown key, wrong type, unknown preset) and the dataclasses'
``__post_init__`` checks (bad value, impossible combination) are reported as one
:class:`RecipeConfigError` naming the key and the fix (``rlmesh run`` prints it as a
``config error:`` line, exit status 2).

Configs and programs ship with the package: ``configs/`` and ``recipes/<program>.py`` of the
source tree, which a wheel carries whole as ``rlmesh/_shipped/{configs,recipes}`` (setup.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import logging
import re
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, ValidationError

from rlmesh import settings
from rlmesh.dashboard.attach import watching
from rlmesh.errors import ConfigError
from rlmesh.files import write_atomically
from rlmesh.launch.local import prewarm
from rlmesh.launch.slurm.cluster import listen_for_nodes
from rlmesh.recipes.config_store import SCHEMAS, register
from rlmesh.recipes.env_presets import choose_preset
from rlmesh.recipes.presets import reset_note
from rlmesh.recipes.startup import say
from rlmesh.recipes.workspace_option import activate_on_controller
from rlmesh.telemetry.api import current_run_dir

logger = logging.getLogger(__name__)

_PKG = Path(__file__).resolve().parents[1]  # the rlmesh package directory


def _shipped(name: str) -> list[Path]:
    """Where ``configs/`` or ``recipes/`` can be: the source tree (editable installs, checkouts),
    then ``rlmesh/_shipped/`` inside the installed package (a wheel: setup.py copies both trees)."""
    return [_PKG.parent / name, _PKG / "_shipped" / name]


def config_dir() -> Path:
    """The shipped configs (``configs/`` of the source tree, or ``rlmesh/_shipped/configs`` of a wheel install)."""
    for d in _shipped("configs"):
        if (d / "config.yaml").exists():
            return d
    raise FileNotFoundError(f"rlmesh's configs are missing (looked in {', '.join(map(str, _shipped('configs')))})")


def docs_dir() -> Path:
    """The guides (``docs/`` of the source tree, or ``rlmesh/_shipped/docs`` of a wheel install): what
    ``rlmesh run --help`` points to, as ``${rlmesh_docs:}`` in configs/config.yaml."""
    for d in _shipped("docs"):
        if (d / "recipes.md").exists():
            return d
    return _shipped("docs")[0]


OmegaConf.register_new_resolver("rlmesh_docs", lambda: str(docs_dir()), replace=True)  # `rlmesh run --help`'s footer


def recipes_dir() -> Path:
    """The controller programs: ``$RLMESH_RECIPES_DIR``, else the shipped ``recipes/``."""
    env = settings.RECIPES_DIR.get()
    if env:
        return Path(env)
    for d in _shipped("recipes"):
        if (d / "ppo.py").exists():
            return d
    raise FileNotFoundError(f"rlmesh's recipe programs are missing; set {settings.RECIPES_DIR.name} to a folder "
                            "with ppo.py")


def load_program(name: str) -> ModuleType:
    """Import ``recipes/<name>.py`` by path (its ``main(cfg, launcher)`` runs the experiment)."""
    path = recipes_dir() / f"{name}.py"
    if not path.exists():
        raise FileNotFoundError(f"program={name!r}: no {path}")
    mod_name = f"rlmesh_recipe_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


PRESET_EXTRAS = {"hydra/sweeper=optuna": "sweep", "hydra/launcher=joblib": "sweep"}
"""Hydra options that a plugin brings, and rlmesh's extra that installs it (pyproject.toml)."""


class RecipeConfigError(Exception):
    """A config that cannot run; ``str()`` names the key and the fix."""


def explain(exc: BaseException, overrides: list[str] | None = None) -> str:
    """Turn Hydra/OmegaConf/dataclass errors into one line naming the key and the fix
    (``overrides``, when given, let an unknown key be matched against the node they select)."""
    chain = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    for e in chain:
        if isinstance(e, ConfigError) or type(e).__name__ == "TelemetryConfigError":
            return str(e)
    cause = chain[-1]
    text = str(cause) or str(exc)
    key = getattr(cause, "full_key", None) or _key_in(text) or _key_in(str(exc))
    if isinstance(cause, MissingMandatoryValue):
        return f"{key} is required and has no value: set it on the command line ({key}=...)"
    if re.search(r"Key '[^']+' not in|not in struct", text):
        return _unknown_key(key or "?", overrides)
    if isinstance(cause, ValidationError):
        first = text.splitlines()[0]
        return f"{key}: {first}; give {key} a value of the type its schema declares (rlmesh run ... --cfg job shows them)"
    m = re.search(r"Ambiguous value for argument '([^'=]+)=([^']*)'", text)
    if m:
        return f"{m.group(1)}={m.group(2)} gives {m.group(1)} several values: add -m (--multirun) to sweep over " \
               f"them, or quote the value to give one string (\"{m.group(1)}='{m.group(2)}'\")"
    m = re.search(r"Could not find '([^']+)'.*?Available options in '([^']+)':\n((?:\t[^\n]*\n?)*)", text, flags=re.S)
    if m:
        group, name = m.group(2), m.group(1).split("/")[-1]
        extra = PRESET_EXTRAS.get(f"{group}={name}")
        if extra:
            return f"{group}={name} needs a Hydra plugin that is not installed: pip install 'rlmesh[{extra}]'"
        options = ", ".join(o.strip() for o in m.group(3).splitlines() if o.strip())
        return f"{m.group(2)}={m.group(1).split('/')[-1]} is not a preset: use one of {options} (or add {m.group(1)}.yaml " \
               "to a config dir on hydra.searchpath)"
    return text.splitlines()[0] if text else type(exc).__name__


def _key_in(text: str) -> str | None:
    m = re.search(r"full_key: ([\w.\[\]]+)", text) or re.search(r"override '([\w.]+)'", text)
    return m.group(1) if m else None


def _unknown_key(key: str, overrides: list[str] | None = None) -> str:
    """``key`` is no field of its node: name the closest field, or list them. The node is the one the
    overrides actually select (``trainer=rloo`` brings RLOO's fields), found by composing again
    without the overrides that set ``key``; failing that, the union over the shipped schemas."""
    parent, _, leaf = key.rpartition(".")
    known = _keys_of(parent, overrides) if overrides is not None else None
    if known is None:
        known = set()
        for schema in SCHEMAS.values():
            node: Any = OmegaConf.structured(schema)
            node = OmegaConf.select(node, parent) if parent else node
            if node is not None and hasattr(node, "keys"):
                known |= set(node.keys())
    close = difflib.get_close_matches(leaf, sorted(known), n=1)
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}?" if close else \
        f"valid keys under {parent or 'the root'}: {', '.join(sorted(known)) or '(none)'}"
    return f"{key} is not a config key: {hint}"


def _keys_of(parent: str, overrides: list[str]) -> set[str] | None:
    """Fields of node ``parent`` in the config ``overrides`` compose to, minus the dotted ones
    (``None`` if that does not compose either)."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    kept = [o for o, k in zip(overrides, keys) if "." not in k or k.startswith("hydra.")]
    try:
        cfg = _compose_raw(kept, None)
    except Exception:  # noqa: BLE001 - only a hint: fall back to the schemas
        return None
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return set(node.keys()) if node is not None and hasattr(node, "keys") else None


def quote_string_lists(overrides: list[str]) -> list[str]:
    """``telemetry.export=tensorboard,wandb`` (what the shell leaves of ``telemetry.export='tensorboard,wandb'``)
    as the one string it means: ``telemetry.export='tensorboard,wandb'``.

    Why: outside ``-m``, Hydra refuses a comma-separated value ("Ambiguous value") because it reads it as a
    sweep, and the shell has already eaten the quotes a user typed around it. Only a key whose schema field is a
    ``str`` is quoted: a number or a bool given two values is still refused, as the sweep it looks like."""
    out = []
    for o in overrides:
        key, eq, value = o.partition("=")
        if eq and "," in value and not key.startswith(("~", "-")) and value[:1] not in "'\"[{" \
                and "(" not in value and _is_str_field(key.lstrip("+")):
            o = f"{key}='{value}'" if "'" not in value else o
        out.append(o)
    return out


def _is_str_field(key: str) -> bool:
    """``key`` (dotted) is a ``str`` (or ``str | None``) field of some recipe schema."""
    for schema in SCHEMAS.values():
        cls: Any = schema
        for part in key.split("."):
            if not dataclasses.is_dataclass(cls):
                cls = None
                break
            cls = typing.get_type_hints(cls).get(part)
        if cls is str or cls == str | None:
            return True
    return False


def compose(overrides: list[str], config_path: Path | None = None) -> tuple[Any, str]:
    """Compose and validate: ``(dataclass config, launcher name)``; raises :class:`RecipeConfigError`."""
    try:
        cfg = _compose_raw(overrides, config_path)
        choice = choose_preset(cfg, overrides)
        if choice is not None:  # recipe=<algo>: its tuned preset for the env, or a line saying there is none
            print(f"rlmesh: {choice.note}", file=sys.stderr, flush=True)
            if choice.overrides != overrides:
                overrides = choice.overrides
                cfg = _compose_raw(overrides, config_path)
        launcher = str(cfg.hydra.runtime.choices.get("launcher", "local"))
        note = reset_note(cfg, overrides, lambda o: _compose_raw(o, config_path))
        if note:  # another trainer than the recipe's preset: which tuned values it drops (docs/extending.md)
            print(f"rlmesh: {note}", file=sys.stderr, flush=True)
        with open_dict(cfg):
            del cfg["hydra"]
        return validate(cfg, overrides), launcher
    except RecipeConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - every composition error becomes one readable line
        raise RecipeConfigError(explain(exc, overrides)) from exc


def preset_overrides(overrides: list[str], config_path: Path | None = None) -> list[str]:
    """``overrides`` with an algorithm-only ``recipe=<algo>`` replaced by its tuned preset for the env, when
    one exists (:mod:`rlmesh.recipes.env_presets`); what :func:`compose` composes, for a caller that hands
    the overrides on (``rlmesh run ... --cfg job`` prints the preset's config). Prints nothing."""
    choice = choose_preset(_compose_raw(overrides, config_path), overrides)
    return overrides if choice is None else choice.overrides


def _compose_raw(overrides: list[str], config_path: Path | None) -> Any:
    """Hydra's compose of the primary config with ``overrides`` (the hydra node included)."""
    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(config_path or config_dir()), version_base="1.3"):
            return hydra_compose("config", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


def validate(cfg: Any, overrides: list[str] | None = None) -> Any:
    """``OmegaConf.to_object``: builds the dataclasses, running every ``__post_init__`` check."""
    try:
        obj = OmegaConf.to_object(cfg)
    except Exception as exc:  # noqa: BLE001
        raise RecipeConfigError(explain(exc, overrides)) from exc
    extra = _extra_keys(obj)
    if extra:  # `+trainer.lrr=...` forces a key in; a dataclass field it is not
        raise RecipeConfigError(_unknown_key(extra[0], overrides))
    return obj


def _extra_keys(obj: Any, prefix: str = "") -> list[str]:
    """Attributes of the config dataclasses that are not fields (added with ``+key=value``)."""
    if not dataclasses.is_dataclass(obj):
        return []
    names = {f.name for f in dataclasses.fields(obj)}
    out = [f"{prefix}{k}" for k in vars(obj) if k not in names and not k.startswith("_")]
    for f in dataclasses.fields(obj):
        out += _extra_keys(getattr(obj, f.name), f"{prefix}{f.name}.")
    return out


def run_config(cfg: Any, launcher: str = "local") -> Any:
    """Run an already validated recipe config with its program and return what it returns (a
    :class:`rlmesh.recipes.loop.RunResult` for the shipped programs); its closing numbers are also
    written to ``runs/<run>/result.json`` (what benchmarks and scripts read back)."""
    activate_on_controller(cfg, launcher)  # workspace.sync: the recipe's _target_ classes import from workspace.path
    if launcher == "slurm":  # procs on other nodes dial this controller and its telemetry service: not on loopback
        listen_for_nodes(cfg.launcher)
    if launcher == "local":  # the procs' template imports torch while this process does too, not after it
        prewarm()
    say(f"running recipes/{cfg.program}.py", getattr(cfg.run, "progress", True))
    with watching(cfg):  # telemetry.dashboard / telemetry.export: started with the run, stopped with it
        result = load_program(cfg.program).main(cfg, launcher)
    run_dir = current_run_dir()
    plain = result.to_dict() if hasattr(result, "to_dict") else result
    if run_dir is not None and isinstance(plain, dict):
        write_atomically(Path(run_dir) / "result.json", json.dumps(plain, indent=1, default=str))
    return result
