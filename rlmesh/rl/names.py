"""Names a config refers to (gymnasium env ids, model folders), checked before any proc starts.

Why here and not where they are used: a wrong name used to surface 40 s into a run, after
every proc had started, as a 60-line remote traceback from ``gymnasium.make`` in a
generator. Checked in the config's ``__post_init__``, it is one ``config error:`` line that
names the key and the closest valid names, before anything is spawned.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from pathlib import Path

from rlmesh.errors import ConfigError


def check_env_id(env_id: str, key: str) -> None:
    """Raise :class:`ConfigError` naming ``key`` unless ``env_id`` is a registered gymnasium id.

    ``module:Name-v0`` ids import ``module`` first, as ``gymnasium.make`` does, so that envs
    registered by a user package are found.
    """
    import gymnasium  # deferred: optional dependency (the gym extra), needed only by gym recipes

    name = env_id
    if ":" in env_id:
        module, name = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"{key}={env_id!r} is invalid: cannot import {module!r} to register it ({exc}); "
                              "install that package or fix the module name") from None
    registry = gymnasium.envs.registry
    if name in registry:
        check_env_extras(env_id, registry[name].entry_point, key)
        return
    close = difflib.get_close_matches(name, list(registry), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.envs.registry for the registered ids"
    raise ConfigError(f"{key}={env_id!r} is not a registered gymnasium environment; {hint}")


ENV_EXTRAS = {"gymnasium.envs.box2d": ("Box2D", "box2d"), "gymnasium.envs.mujoco": ("mujoco", "mujoco")}
"""gymnasium's env modules whose envs need a package gymnasium does not install itself: module prefix ->
(the package to import, rlmesh's extra that installs it; gymnasium's extra of the same name does too)."""


def check_env_extras(env_id: str, entry_point: object, key: str) -> None:
    """A registered env whose simulator is not installed (LunarLander without Box2D, Hopper without MuJoCo) is
    refused here, naming the extra, instead of failing in ``gymnasium.make`` inside a generator proc."""
    for prefix, (package, extra) in ENV_EXTRAS.items():
        if isinstance(entry_point, str) and entry_point.startswith(prefix) \
                and importlib.util.find_spec(package) is None:
            raise ConfigError(f"{key}={env_id!r} needs {package}, which is not installed: "
                              f"pip install 'rlmesh[{extra}]' (or 'gymnasium[{extra}]')")


def check_model_path(path: str | None, key: str) -> None:
    """A local model folder must exist and hold a ``config.json`` (what ``save_pretrained`` writes)."""
    if path is None:
        return
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ConfigError(f"{key}={path!r} is invalid: no such folder; give a local Hugging Face model folder "
                          "(save_pretrained), or null for the built-in transformer")
    if not (p / "config.json").is_file():
        raise ConfigError(f"{key}={path!r} is invalid: the folder has no config.json, so it is not a Hugging Face "
                          "model folder (save_pretrained writes one)")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
"""A model folder holds a tokenizer when it has one of these (what ``save_pretrained`` writes)."""


def has_tokenizer(path: str | Path) -> bool:
    """Whether a model folder ships a tokenizer (cheap: no transformers import, for config checks)."""
    return any((Path(path).expanduser() / f).exists() for f in TOKENIZER_FILES)
