"""Running a composed recipe config as ``rlmesh run`` does: its exit status, and inside a sweep job
the links between the job's Hydra folder and the run (:mod:`rlmesh.recipes.sweep_links`)."""

from __future__ import annotations

import os
import sys
from typing import Any

import rlmesh as rm
from rlmesh.errors import ConfigError
from rlmesh.recipes.compose import run_config
from rlmesh.recipes.sweep_links import JOB_DIR_ENV, link_job
from rlmesh.rl.resilience import RunFailed


def run_composed(cfg: Any, launcher: str) -> int:
    """Run a validated config; the exit status of ``rlmesh run`` (0 done, 1 the run failed, 2 the config
    could not run). Inside a sweep job (``$RLMESH_HYDRA_JOB_DIR``), the job folder and the run point at
    each other whatever the outcome (:func:`rlmesh.recipes.sweep.link_job`)."""
    result, status, rc = None, "failed", 1
    try:
        result = run_config(cfg, launcher)
        status, rc = "ok", 0
    except ConfigError as exc:  # found by the program before any proc started (an actor class that cannot import)
        print(f"config error: {exc}", file=sys.stderr)
        status, rc = "config error", 2
    except RunFailed as exc:
        rm.telemetry.end_run("failed")
        print(f"run failed: {exc}", file=sys.stderr)
    finally:
        if os.environ.get(JOB_DIR_ENV):
            link_job(os.environ[JOB_DIR_ENV], status, getattr(result, "objective", None))
    return rc
