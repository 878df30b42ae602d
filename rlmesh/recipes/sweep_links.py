"""How a sweep job's Hydra folder and its telemetry run point at each other.

Each job of ``rlmesh run -m`` runs its recipe as its own ``rlmesh run`` process, told its Hydra
job folder in ``$RLMESH_HYDRA_JOB_DIR``. When the run ends (well or not), :func:`link_job` writes

- ``<job dir>/rlmesh_run.json``: the run id, its run directory, how it ended, its objective;
- ``<run dir>/hydra_job.json``: the job folder (with Hydra's ``.hydra/overrides.yaml`` in it).

The sweep (:mod:`rlmesh.recipes.sweep`) reads the first to build its summary table and database.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import rlmesh as rm
from rlmesh import settings
from rlmesh.files import write_atomically
from rlmesh.telemetry.api import current_run_dir

JOB_DIR_ENV = settings.HYDRA_JOB_DIR.name
"""Set by a sweep job for the ``rlmesh run`` process it starts: that job's Hydra output folder."""
RUN_LINK = "rlmesh_run.json"
"""In a job folder: which run it made."""
JOB_LINK = "hydra_job.json"
"""In a run directory: which Hydra job made it."""


def link_job(job_dir: str, status: str, objective: float | None) -> dict[str, Any]:
    """Write both pointers (the run side only when telemetry made a run); returns the job side's record."""
    run_dir = current_run_dir()
    record = {"run_id": rm.telemetry.current_run(), "run_dir": str(run_dir) if run_dir else None, "status": status,
              "objective": objective if objective is None or math.isfinite(objective) else None}
    Path(job_dir).mkdir(parents=True, exist_ok=True)
    write_atomically(Path(job_dir) / RUN_LINK, json.dumps(record, indent=1))
    if run_dir is not None:
        write_atomically(Path(run_dir) / JOB_LINK, json.dumps({"job_dir": str(Path(job_dir).resolve())}, indent=1))
    return record


def read_run_link(job_dir: str | Path) -> dict[str, Any]:
    """The job side's record, or ``{}`` when the job's process died before writing it."""
    path = Path(job_dir) / RUN_LINK
    return json.loads(path.read_text()) if path.exists() else {}
