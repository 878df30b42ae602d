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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import rlmesh as rm
from rlmesh.errors import ConfigError
from rlmesh.files import write_atomically
from rlmesh.launch.capture import reclaim_dead_capture_dirs
from rlmesh.recipes.compose import RecipeConfigError, explain, validate
from rlmesh.recipes.config_store import SCHEMAS, role_types, schema_node
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.api import RUN_ID_ENV, current_run_dir, exit_status, finish_run

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
    reclaim_dead_capture_dirs()  # FIFO folders of controllers killed outright (on resume: this run's dead one)
    resume = cfg.run.resume
    if resume and not cfg.telemetry.enabled:
        raise ConfigError(f"run.resume={resume!r} needs telemetry (the run's database and checkpoints live in its "
                          "run directory): drop telemetry=off")
    run_id = rm.telemetry.start_run(config=cfg, run_id=resume or None, resume=bool(resume))
    run_dir = current_run_dir()
    if run_dir is None:
        return RunStart(run_id, None, 0)
    if resume:
        reap_leftover_procs(rm.telemetry.query, run_id)  # type: ignore[arg-type]  # a run directory means a run id
    if cfg.trainer.checkpoint_dir is None:
        cfg.trainer.checkpoint_dir = str(run_dir / "checkpoints")
    path = run_dir / RECIPE_JSON
    saved = json.loads(path.read_text()) if path.exists() else None
    generation = saved["generation"] + 1 if resume and saved else 0
    if saved is None or not resume:
        plain: Any = OmegaConf.to_container(OmegaConf.structured(cfg))  # a dict: cfg is a structured config
        plain["run"]["resume"] = None
        saved = {"program": cfg.program, "launcher": launcher, "config": OmegaConf.to_yaml(plain),
                 "role_types": role_types(cfg)}
    saved["generation"] = generation
    write_atomically(path, json.dumps(saved, indent=1))
    if resume:
        logger.warning("resuming run %s (controller generation %d) from %s", run_id, generation,
                       cfg.trainer.checkpoint_dir)
    return RunStart(run_id, run_dir, generation)


def stop_on_sigterm() -> None:
    """Handle SIGTERM (``kill``, ``timeout``, a pod's deletion) as Ctrl-C is handled: a
    ``KeyboardInterrupt`` in the main thread, so the recipe stops its procs cleanly (actors'
    ``on_stop``: the trainer's final checkpoint) and the run is recorded ``interrupted``
    instead of the controller dying mid-run and leaving it ``crashed``. A second SIGTERM during
    that stop is ignored (SIGKILL still ends it). Only the main thread may install it: elsewhere
    (a sweep job run in a thread) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)


def end_interrupted(exc: KeyboardInterrupt) -> int:
    """After a Ctrl-C or SIGTERM reached ``rlmesh run``: finish the run as ``interrupted`` (procs
    stopped first) and return the shell's exit status for it (130)."""
    status, error = exit_status(exc)
    finish_run(status, error)
    logger.warning("run %s: %s", status, error)
    return 130


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
    info = runs.read_json(run_dir / runs.RUN_JSON) or {}
    if runs.run_status(info) == "running":  # before anything starts: two controllers must not share a run
        pid = info.get("pid")
        raise RecipeConfigError(f"resume={spec}: run {run_dir.name} is still running (controller pid {pid} on "
                                f"{info.get('host')}); stop it first (kill {pid}: a clean stop, then it can be "
                                "resumed), or start a new run")
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
    problem = finished_without_more_budget(run_dir, base, cfg, overrides)
    if problem:
        raise RecipeConfigError(f"resume={spec}: {problem}")
    pin_to_run_dir(cfg, run_dir, overrides, info.get("id"))
    return validate(cfg), saved["launcher"]


BUDGET_KEYS = ("trainer.total_steps", "steps")
"""The config keys that say how much a recipe trains (PPO: env steps; GRPO: train steps)."""


def finished_without_more_budget(run_dir: Path, saved: Any, cfg: Any, overrides: list[str]) -> str | None:
    """Why resuming this run must be refused, or ``None``: a run that finished (``ok``) would
    silently train past its budget; it continues only when a larger budget is given explicitly."""
    status = runs.run_status(runs.read_json(run_dir / runs.RUN_JSON) or {})
    if status != "ok":
        return None
    for key in BUDGET_KEYS:
        before, now = OmegaConf.select(saved, key), OmegaConf.select(cfg, key)
        if before is not None and any(o.startswith(f"{key}=") for o in overrides) and now > before:
            return None
    keys = [k for k in BUDGET_KEYS if OmegaConf.select(saved, k) is not None]
    have = ", ".join(f"{k}={OmegaConf.select(saved, k)}" for k in keys)
    return (f"run {run_dir.name} already finished (status ok, {have}); resuming it would train past its budget. "
            f"To continue it, give a larger budget explicitly (e.g. {keys[0] if keys else BUDGET_KEYS[0]}=<more>), "
            "or start a new run")


def pin_to_run_dir(cfg: Any, run_dir: Path, overrides: list[str], original_id: str | None = None) -> None:
    """A resume acts only on the run directory it resolved (a copy of a run resumes the copy):
    ``telemetry.runs_dir`` becomes that directory's parent, and a checkpoint directory that was
    the original run's own (``<run dir>/checkpoints``, the default) becomes the resolved one's. An
    explicit ``trainer.checkpoint_dir=`` override is kept. ``original_id``: the id the run was
    started under (its ``run.json``), which a copy under another name still carries: its default
    checkpoint folder is ``<original_id>/checkpoints``."""
    cfg.telemetry.runs_dir = str(run_dir.parent)
    ck = cfg.trainer.checkpoint_dir
    if any(o.startswith("trainer.checkpoint_dir=") for o in overrides):
        return
    own = {run_dir.name, original_id} - {None}
    if ck is None or (Path(ck).name == "checkpoints" and Path(ck).parent.name in own):
        cfg.trainer.checkpoint_dir = str(run_dir / "checkpoints")


def _config_class(spec: str, role: str, path: str) -> type:
    """Import the config class ``path`` a run saved for ``role`` (a plugin's must still be installed)."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise RecipeConfigError(f"resume={spec}: the run's {role} config class {path} cannot be imported ({exc}); "
                                "install the package that provides it") from exc
