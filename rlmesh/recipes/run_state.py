"""A recipe run's identity on disk: starting a run, or continuing one whose controller died.

``rlmesh run ... resume=RUN`` (or ``resume=latest``) must continue *the same* run: the
same run id and telemetry database, the trainer's newest checkpoint, the same config.
So each run keeps, next to its database, what it was started with (``recipe.json``: program,
launcher, config as YAML) and its checkpoints (``checkpoints/``, unless
``trainer.checkpoint_dir`` says otherwise). :func:`begin` is what a recipe's ``main`` calls
first; :func:`resume_config` is how the CLI rebuilds the config of the run to continue.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import rlmesh as rm
from rlmesh.errors import ConfigError
from rlmesh.recipes.compose import RecipeConfigError, explain, validate
from rlmesh.recipes.config_store import SCHEMAS, role_types, schema_node
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.api import RUN_ID_ENV, current_run_dir

logger = logging.getLogger(__name__)

RECIPE_JSON = "recipe.json"


@dataclass
class RunStart:
    """What :func:`begin` returns: the run's id and directory (``None`` with telemetry off) and
    its *generation*: 0 for the first controller, +1 for each resume."""

    run_id: str | None
    run_dir: Path | None
    generation: int


def begin(cfg: Any, launcher: str) -> RunStart:
    """Start (or, with ``cfg.run.resume``, continue) the run of recipe config ``cfg``.

    Sets ``cfg.trainer.checkpoint_dir`` to ``<run dir>/checkpoints`` when unset, so every
    run can be resumed and a restarted trainer finds its checkpoints.
    """
    resume = cfg.run.resume
    if resume and not cfg.telemetry.enabled:
        raise ConfigError(f"run.resume={resume!r} needs telemetry (the run's database and checkpoints live in its "
                          "run directory): drop telemetry=off")
    run_id = rm.telemetry.start_run(config=cfg, run_id=resume or None, resume=bool(resume))
    run_dir = current_run_dir()
    if run_dir is None:
        return RunStart(run_id, None, 0)
    if resume:
        reap_leftover_procs(rm.telemetry.query, run_id)
    if cfg.trainer.checkpoint_dir is None:
        cfg.trainer.checkpoint_dir = str(run_dir / "checkpoints")
    path = run_dir / RECIPE_JSON
    saved = json.loads(path.read_text()) if path.exists() else None
    generation = saved["generation"] + 1 if resume and saved else 0
    if saved is None or not resume:
        plain = OmegaConf.to_container(OmegaConf.structured(cfg))
        plain["run"]["resume"] = None
        saved = {"program": cfg.program, "launcher": launcher, "config": OmegaConf.to_yaml(plain),
                 "role_types": role_types(cfg)}
    saved["generation"] = generation
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(saved, indent=1))
    tmp.replace(path)
    if resume:
        logger.warning("resuming run %s (controller generation %d) from %s", run_id, generation,
                       cfg.trainer.checkpoint_dir)
    return RunStart(run_id, run_dir, generation)


def reap_leftover_procs(query: Any, run_id: str, wait_s: float = 5.0) -> list[int]:
    """SIGKILL workers of the dead controller that are still winding down on this host (they exit
    within seconds of losing it, but a trainer still writing a checkpoint must not race the
    resumed one). Returns the pids killed."""
    rows = query("SELECT DISTINCT pid FROM actors WHERE event = 'spawned' AND pid IS NOT NULL "
                 f"AND host = '{socket.gethostname()}'").to_pylist()
    killed = []
    for pid in (int(r["pid"]) for r in rows):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                mine = f"{RUN_ID_ENV}={run_id}".encode() in f.read().split(b"\0")  # a worker of this run, not a reused pid
        except OSError:
            continue  # gone already (or not ours to read)
        if mine and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    deadline = time.monotonic() + wait_s
    while killed and time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in killed):
        time.sleep(0.02)
    if killed:
        logger.warning("resume: killed %d procs left over from the dead controller: %s", len(killed), killed)
    return killed


def resume_config(spec: str, overrides: list[str]) -> tuple[Any, str]:
    """The config and launcher of run ``spec`` (an id, ``latest`` or a run directory) with
    ``overrides`` applied on top, validated like a fresh ``rlmesh run``; ``run.resume`` set."""
    try:
        run_dir = runs.resolve_run(spec)
    except Exception as exc:  # noqa: BLE001 - RunNotFoundError names the runs it knows
        raise RecipeConfigError(f"resume={spec}: {exc}") from exc
    path = run_dir / RECIPE_JSON
    if not path.exists():
        raise RecipeConfigError(f"resume={spec}: {run_dir} has no {RECIPE_JSON} (the run was not started by a "
                                "recipe of this version); start a new run instead")
    saved = json.loads(path.read_text())
    schema = SCHEMAS.get(saved["program"])
    if schema is None:
        raise RecipeConfigError(f"resume={spec}: program {saved['program']!r} has no schema here")
    # the config classes the run was composed with (a run saved before role types: the schema's defaults)
    base = schema_node(schema) if "role_types" in saved else OmegaConf.structured(schema)
    for role, cls_path in saved.get("role_types", {}).items():
        base[role] = OmegaConf.structured(_config_class(spec, role, cls_path))
    base = OmegaConf.merge(base, OmegaConf.create(saved["config"]))
    try:
        extra = OmegaConf.from_dotlist([o for o in overrides if not o.startswith(("recipe=", "resume="))])
        cfg = OmegaConf.merge(base, extra, {"run": {"resume": run_dir.name}})
    except Exception as exc:  # noqa: BLE001
        raise RecipeConfigError(explain(exc)) from exc
    return validate(cfg), saved["launcher"]


def _config_class(spec: str, role: str, path: str) -> type:
    """Import the config class ``path`` a run saved for ``role`` (a plugin's must still be installed)."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise RecipeConfigError(f"resume={spec}: the run's {role} config class {path} cannot be imported ({exc}); "
                                "install the package that provides it") from exc
