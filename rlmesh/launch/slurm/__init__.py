"""The Slurm launcher: worker procs are job steps (``srun``) of the job the controller runs in or asks for.

    from rlmesh.launch.slurm import SlurmCluster

    cluster = SlurmCluster(nodes=4)                        # inside sbatch/salloc: that job; else salloc
    procs = cluster.spawn_procs(per_host={"gpus": 8}, hosts=4, restart=rm.Restart(max_restarts=3))
    gens = procs.spawn("gen", Generator)                   # exactly as with rm.this_host()

One proc = one step of one task (``srun --overlap --nodes=1 --ntasks=1 --nodelist=NODE``): the
controller's supervision, restart policy and telemetry apply unchanged; a step that ends is a dead
proc whose ``poll()`` says why in Slurm's words (a node failure, a cancel, a preemption); a node
that stops answering is a lost host whose procs restart on the job's other nodes; SIGTERM from
Slurm to the job (preemption, time limit) stops the run in order, resumable.

Modules, bottom to top: ``config`` (``SlurmConfig``), ``commands`` (argv and output parsing, pure),
``allocation`` (the job, its nodes), ``steps`` (one step's handle), ``worker_plugin`` (SIGTERM in a
worker), ``launcher`` (the controller's ``Launcher``), ``cluster`` (``SlurmCluster``). Names load on
first use, so a worker that imports only the plugin does not import the controller side.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["SlurmCluster", "SlurmConfig", "SlurmError", "SlurmLauncher"]

_WHERE = {"SlurmCluster": "cluster", "SlurmConfig": "config", "SlurmError": "allocation", "SlurmLauncher": "launcher"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"rlmesh.launch.slurm.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlmesh.launch.slurm' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from rlmesh.launch.slurm.allocation import SlurmError
    from rlmesh.launch.slurm.cluster import SlurmCluster
    from rlmesh.launch.slurm.config import SlurmConfig
    from rlmesh.launch.slurm.launcher import SlurmLauncher
