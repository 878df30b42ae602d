"""The worker side of the Slurm launcher: what SIGTERM means to a proc that is a job step.

Slurm sends SIGTERM to every task of a job that is ending (a preemption with a grace time, the
time limit, ``scancel``), often without signalling the batch script the controller runs in. A
worker that exited on it would look like a dead proc to the controller, which would restart it
while the job ends, and the trainer would stop without the run's orderly stop. So a step's
worker reports the signal on its stderr (which ``srun`` carries to the controller's launcher) and
keeps serving; the controller then stops the run in order, final checkpoint included, well within
the grace time, or, when only this step was signalled, ends this proc as a death to recover from.
Runs in the worker through ``RLMESH_WORKER_PLUGINS`` (``rlmesh.launch.slurm.worker_plugin:install``).
"""

from __future__ import annotations

import sys
from typing import Any

from rlmesh.actor import hooks
from rlmesh.launch.slurm.commands import PREEMPT_MARK

PLUGIN = "rlmesh.launch.slurm.worker_plugin:install"


def _report() -> bool:
    sys.stderr.write(f"{PREEMPT_MARK} (preemption, the time limit or scancel); the controller decides\n")
    sys.stderr.flush()
    return True


def install(info: Any) -> None:
    """Worker plugin: SIGTERM is reported to the controller, not acted on here."""
    hooks.set_sigterm_handler(_report)
