"""``rlmesh run``: compose a recipe config with Hydra, validate it, run its controller program.

    rlmesh run recipe=ppo_cartpole trainer.lr=1e-4 generator.replicas=3
    rlmesh run -m recipe=ppo_cartpole trainer.lr=1e-3,2e-3 run.seed=0,1     # multirun sweep
    rlmesh run recipe=my_recipe hydra.searchpath=[file:///home/me/configs]   # your own configs
    rlmesh run recipe=ppo_cartpole --cfg job                                 # print the config, run nothing
    rlmesh run resume=latest                     # continue a run whose controller died (or resume=RUN_ID)
    rlmesh run recipe=ppo_cartpole faults=generator_kill                     # prove it survives (docs/faults.md)

Everything that can be wrong with a config is found here, before any proc starts:
composition errors (unknown key, wrong type, unknown preset) and the dataclasses'
``__post_init__`` checks (bad value, impossible combination) are reported as one
``config error:`` line naming the key and the fix, exit status 2.

Configs and programs ship with the package: ``configs/`` and ``recipes/<program>.py`` of the
source tree, which a wheel installs as ``<prefix>/share/rlmesh/{configs,recipes}`` (pyproject.toml).
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

_PKG = Path(__file__).resolve().parent


def _shipped(name: str) -> list[Path]:
    """Where ``configs/`` or ``recipes/`` can be: the source tree (editable installs, checkouts),
    then ``<prefix>/share/rlmesh/`` (a wheel's data files, see pyproject.toml)."""
    import site

    prefixes = [Path(sys.prefix), Path(site.getuserbase())]
    return [_PKG.parent / name] + [p / "share" / "rlmesh" / name for p in prefixes]


def config_dir() -> Path:
    """The shipped configs (``configs/`` of the source tree, or ``share/rlmesh/configs`` of a wheel install)."""
    for d in _shipped("configs"):
        if (d / "config.yaml").exists():
            return d
    raise FileNotFoundError(f"rlmesh's configs are missing (looked in {', '.join(map(str, _shipped('configs')))})")


def recipes_dir() -> Path:
    """The controller programs: ``$RLMESH_RECIPES_DIR``, else the shipped ``recipes/``."""
    env = os.environ.get("RLMESH_RECIPES_DIR")
    if env:
        return Path(env)
    for d in _shipped("recipes"):
        if (d / "ppo.py").exists():
            return d
    raise FileNotFoundError("rlmesh's recipe programs are missing; set RLMESH_RECIPES_DIR to a folder with ppo.py")


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


class RecipeConfigError(Exception):
    """A config that cannot run; ``str()`` names the key and the fix."""


def explain(exc: BaseException) -> str:
    """Turn Hydra/OmegaConf/dataclass errors into one line naming the key and the fix."""
    from omegaconf.errors import MissingMandatoryValue, ValidationError

    from rlmesh.errors import ConfigError

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
        return _unknown_key(key or "?")
    if isinstance(cause, ValidationError):
        first = text.splitlines()[0]
        return f"{key}: {first}; give {key} a value of the type its schema declares (rlmesh run ... --cfg job shows them)"
    m = re.search(r"Could not find '([^']+)'.*?Available options in '([^']+)':\n((?:\t[^\n]*\n?)*)", text, flags=re.S)
    if m:
        options = ", ".join(o.strip() for o in m.group(3).splitlines() if o.strip())
        return f"{m.group(2)}={m.group(1).split('/')[-1]} is not a preset: use one of {options} (or add {m.group(1)}.yaml " \
               "to a config dir on hydra.searchpath)"
    return text.splitlines()[0] if text else type(exc).__name__


def _key_in(text: str) -> str | None:
    m = re.search(r"full_key: ([\w.\[\]]+)", text) or re.search(r"override '([\w.]+)'", text)
    return m.group(1) if m else None


def _unknown_key(key: str) -> str:
    from omegaconf import OmegaConf

    from rlmesh.rl.recipe_config import GRPORecipeConfig, PPORecipeConfig

    parent, _, leaf = key.rpartition(".")
    known: set[str] = set()
    for schema in (PPORecipeConfig, GRPORecipeConfig):
        node: Any = OmegaConf.structured(schema)
        try:
            node = OmegaConf.select(node, parent) if parent else node
        except Exception:  # noqa: BLE001
            node = None
        if node is not None and hasattr(node, "keys"):
            known |= set(node.keys())
    close = difflib.get_close_matches(leaf, sorted(known), n=1)
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}?" if close else \
        f"valid keys under {parent or 'the root'}: {', '.join(sorted(known)) or '(none)'}"
    return f"{key} is not a config key: {hint}"


def compose(overrides: list[str], config_path: Path | None = None) -> tuple[Any, str]:
    """Compose and validate: ``(dataclass config, launcher name)``; raises :class:`RecipeConfigError`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from rlmesh.rl.config_store import register

    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(config_path or config_dir()), version_base="1.3"):
            cfg = hydra_compose("config", overrides=overrides, return_hydra_config=True)
        launcher = str(cfg.hydra.runtime.choices.get("launcher", "local"))
        with open_dict(cfg):
            del cfg["hydra"]
        return validate(cfg), launcher
    except RecipeConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - every composition error becomes one readable line
        raise RecipeConfigError(explain(exc)) from exc
    finally:
        GlobalHydra.instance().clear()


def validate(cfg: Any) -> Any:
    """``OmegaConf.to_object``: builds the dataclasses, running every ``__post_init__`` check."""
    from omegaconf import OmegaConf

    try:
        obj = OmegaConf.to_object(cfg)
    except Exception as exc:  # noqa: BLE001
        raise RecipeConfigError(explain(exc)) from exc
    extra = _extra_keys(obj)
    if extra:  # `+trainer.lrr=...` forces a key in; a dataclass field it is not
        raise RecipeConfigError(_unknown_key(extra[0]))
    return obj


def _extra_keys(obj: Any, prefix: str = "") -> list[str]:
    """Attributes of the config dataclasses that are not fields (added with ``+key=value``)."""
    import dataclasses

    if not dataclasses.is_dataclass(obj):
        return []
    names = {f.name for f in dataclasses.fields(obj)}
    out = [f"{prefix}{k}" for k in vars(obj) if k not in names and not k.startswith("_")]
    for f in dataclasses.fields(obj):
        out += _extra_keys(getattr(obj, f.name), f"{prefix}{f.name}.")
    return out


def run_config(cfg: Any, launcher: str = "local") -> dict:
    """Run an already validated recipe config with its program; the program's closing numbers
    are also written to ``runs/<run>/result.json`` (what benchmarks and scripts read back)."""
    import json

    result = load_program(cfg.program).main(cfg, launcher)
    from rlmesh.telemetry.api import current_run_dir

    run_dir = current_run_dir()
    if run_dir is not None and isinstance(result, dict):
        (Path(run_dir) / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def _multirun(overrides: list[str]) -> int:
    """``-m``: Hydra's sweeper expands the overrides; each job is validated, then run as its own
    ``rlmesh run`` process, so every job gets a fresh controller, its own procs and its own
    telemetry run (and one failing job does not take the sweep down)."""
    import subprocess

    import hydra
    from hydra.core.hydra_config import HydraConfig

    from rlmesh.rl.config_store import register

    register()
    failures: list[str] = []

    @hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")
    def job(cfg: Any) -> None:
        task_overrides = list(HydraConfig.get().overrides.task)
        try:
            validate(cfg)
        except RecipeConfigError as exc:
            failures.append(str(exc))
            print(f"config error: {exc}", file=sys.stderr)
            return
        print(f"[multirun job {HydraConfig.get().job.num}] rlmesh run {' '.join(task_overrides)}", flush=True)
        rc = subprocess.call([sys.executable, "-m", "rlmesh.cli", "run", *task_overrides])
        if rc:
            failures.append(f"job {task_overrides} exited with {rc}")

    saved = sys.argv
    sys.argv = ["rlmesh run", "-m", *overrides]
    try:
        job()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = saved
    return 2 if failures else 0


def run_main(argv: list[str]) -> int:
    """Entry point of ``rlmesh run`` (see the module docstring)."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    if any(a in ("-m", "--multirun") for a in argv):
        return _multirun([a for a in argv if a not in ("-m", "--multirun")])
    show = "--cfg" in argv
    overrides = [a for a in argv if a not in ("--cfg", "job")]
    logging.basicConfig(level=os.environ.get("RLMESH_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    resume = next((a.split("=", 1)[1] for a in overrides if a.startswith("resume=")), None)
    try:
        if resume is not None:  # the saved config of that run, with the other overrides on top
            from rlmesh.rl.run_state import resume_config

            _runs_dir_override(overrides)
            cfg, launcher = resume_config(resume, overrides)
        else:
            cfg, launcher = compose(overrides)
    except RecipeConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if show:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        return 0
    from rlmesh.rl.resilience import RunFailed
    from rlmesh.rl.run_state import end_interrupted, stop_on_sigterm
    from rlmesh.telemetry.api import finish_run

    stop_on_sigterm()
    try:
        run_config(cfg, launcher)
    except RunFailed as exc:
        finish_run("failed", str(exc).splitlines()[0] if str(exc) else "RunFailed")
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        return end_interrupted(exc)
    return 0


def _runs_dir_override(overrides: list[str]) -> None:
    """``telemetry.runs_dir=...`` next to ``resume=``: look for the run there."""
    for o in overrides:
        if o.startswith("telemetry.runs_dir="):
            os.environ["RLMESH_RUNS_DIR"] = o.split("=", 1)[1]
