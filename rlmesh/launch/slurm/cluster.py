"""``SlurmCluster``: a Slurm job as a place to spawn procs, the counterpart of ``rm.this_host()``."""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

from rlmesh import settings
from rlmesh.actor.controller import Controller, Restart
from rlmesh.actor.proc_mesh import ProcMesh
from rlmesh.errors import ConfigError
from rlmesh.launch.admission import MiB, PROC_BYTES, ClusterCapacity, ProcDemand, admit_cluster
from rlmesh.launch.cluster import RemoteCluster
from rlmesh.launch.slurm.allocation import Allocation, route_address, slurmctld_address
from rlmesh.launch.slurm.commands import NodeInfo, gpus_per_task, place
from rlmesh.launch.slurm.config import SlurmConfig
from rlmesh.launch.slurm.launcher import SlurmLauncher
from rlmesh.transport.auth import is_loopback_address

__all__ = ["SlurmCluster"]

logger = logging.getLogger(__name__)


class SlurmCluster(RemoteCluster[SlurmLauncher]):
    """A Slurm job as a place to spawn procs on: the job this controller runs in (``sbatch``,
    ``salloc``: ``SLURM_JOB_ID`` is set), or one it asks for (``salloc --no-shell`` for
    ``launcher.nodes`` nodes, cancelled by :meth:`close`).

    ``config``: a :class:`SlurmConfig` or a mapping of its fields (the Hydra ``launcher`` group);
    keyword ``overrides`` replace single fields. Before the controller starts, it makes the
    controller listen on every interface and advertise its address on the route to the nodes
    (``RLMESH_BIND_HOST`` / ``RLMESH_ADVERTISE_HOST``, unless they are set already).
    """

    _names = itertools.count()

    def __init__(self, config: SlurmConfig | dict[str, Any] | None = None, **overrides: Any):
        if isinstance(config, SlurmConfig):
            base = {f: getattr(config, f) for f in config.__dataclass_fields__}
        else:
            base = dict(config or {})
        self.config = SlurmConfig.from_dict({**base, **overrides})
        alloc = Allocation.current() or Allocation.request(self.config, self.config.nodes or 1)
        self.launcher = SlurmLauncher(self.config, alloc)
        try:
            nodes = self.launcher.refresh_nodes()
            self._reachable_controller(nodes[0].addr)
        except BaseException:
            self.launcher.close()
            raise
        self._close_at_exit()

    @property
    def job_id(self) -> str:
        """The Slurm job the procs run in."""
        return self.launcher.alloc.job_id

    def _reachable_controller(self, node_addr: str) -> None:
        """Workers on other nodes dial the controller: it must not listen on loopback only."""
        controller = Controller.current()
        if controller is None or controller.closed:
            listen_for_nodes(self.config, node_addr)
            return
        if is_loopback_address(controller.addr):
            raise ConfigError(f"the controller already listens on {controller.addr.partition('#')[0]} (loopback), "
                              f"which Slurm nodes cannot dial: create the SlurmCluster before anything starts "
                              f"the controller, or set RLMESH_BIND_HOST=0.0.0.0 and RLMESH_ADVERTISE_HOST")

    def spawn_procs(self, per_host: dict[str, int] | None = None, *, hosts: int | None = None,
                    restart: Restart | None = None, name: str | None = None, env: dict[str, str] | None = None,
                    timeout: float | None = None) -> ProcMesh:
        """Start worker procs as job steps, one task each, laid out as ``per_host``.

        Without ``hosts`` the mesh has the shape of ``per_host`` (as on ``rm.this_host()``: the same
        program runs unchanged) and its ranks are spread over ``launcher.nodes`` nodes of the job
        (0: all of them) by ``launcher.distribution``. With ``hosts=N`` the mesh is
        ``{"hosts": N, **per_host}``: ``per_host`` ranks on each of N nodes (``per_host={"gpus": 8}``
        is 8 tasks per node, each bound to one GPU where the nodes have GPU GRES).
        """
        if name is None:
            n_ = next(SlurmCluster._names)
            name = "steps" if n_ == 0 else f"steps{n_}"
        dims = dict(per_host or {"procs": 1})
        if not dims:
            raise ValueError("per_host needs at least one dimension, e.g. per_host={'procs': 4}")
        nodes = [n for n in self.launcher.refresh_nodes() if n.usable and n.name not in self.launcher.lost]
        if not nodes:
            raise ConfigError(f"no usable node in Slurm job {self.job_id} (`sinfo -N` says why)")
        per_node = 0
        if hosts is not None:
            if not 1 <= hosts <= len(nodes):
                raise ConfigError(f"spawn_procs(hosts={hosts}) but Slurm job {self.job_id} has {len(nodes)} usable "
                                  f"node(s); ask for more (launcher.nodes, sbatch --nodes) or use fewer hosts")
            per_node = math.prod(dims.values())
            dims = {"hosts": hosts, **dims}
            chosen = nodes[:hosts]
        else:
            chosen = nodes[:self.config.nodes or len(nodes)]
        n = math.prod(dims.values())
        gpus = gpus_per_task(self.config, dims, chosen)
        self._admit(dims, n, chosen, gpus)
        layout = [chosen[i].name for i in place(n, len(chosen), self.config.distribution, per_node)]
        self.launcher.set_layout(name, layout, gpus)
        logger.info("mesh %s: %d proc(s) on Slurm node(s) %s of job %s", name, n, ",".join(dict.fromkeys(layout)),
                    self.job_id)
        return self._launch(name, dims, restart, env, timeout)

    def _admit(self, dims: dict[str, int], n: int, nodes: list[NodeInfo], gpus: int) -> None:
        """Refuse (one line, before any step) a mesh that the memory of the nodes it may use cannot hold
        at the 256 MiB a recipe proc takes, beside this cluster's running procs (``scontrol``'s
        ``RealMemory``, summed). CPU counts only for GPU workers, whose ``--exact`` steps each hold
        their CPUs (CPU-only steps ``--overlap``: they share, slower rather than refused)."""
        if not all(node.memory_mb for node in nodes):
            return  # a node that reports no memory: nothing to judge by
        cap = ClusterCapacity(float(sum(node.cpus for node in nodes)), sum(node.memory_mb for node in nodes) * MiB,
                              None, f"the {len(nodes)} usable node{'' if len(nodes) == 1 else 's'} of Slurm job "
                                    f"{self.job_id} (scontrol's RealMemory)")
        exact = ProcDemand(PROC_BYTES, float(max(1, self.config.cpus_per_task)), cpu_key="launcher.cpus_per_task")
        demand = exact if gpus > 0 else ProcDemand(PROC_BYTES)
        admit_cluster(f"spawn_procs(per_host={dims})", n, demand, [ProcDemand(PROC_BYTES) for _ in self._running_meshes()],
                      cap, "spawn fewer procs, or use more nodes (launcher.nodes, sbatch --nodes)")

    def __repr__(self) -> str:
        return f"<SlurmCluster job={self.job_id}>"


def listen_for_nodes(config: SlurmConfig | dict[str, Any] | None = None, node_addr: str = "") -> None:
    """Make this process's sockets (the controller's, the telemetry service's) reachable from the
    Slurm nodes: ``RLMESH_BIND_HOST=0.0.0.0`` and ``RLMESH_ADVERTISE_HOST`` = ``launcher.controller_host``,
    or this host's address on the route to ``node_addr`` (default: the first node of the job this
    process runs in, else slurmctld's host). Settings already made are kept.

    When: before anything binds a socket. ``rlmesh run ... launcher=slurm`` calls it before the run
    starts its telemetry service; a program of its own gets it from ``SlurmCluster()``."""
    cfg = config if isinstance(config, SlurmConfig) else SlurmConfig.from_dict(config)
    settings.BIND_HOST.setdefault("0.0.0.0")
    if settings.ADVERTISE_HOST.is_set():
        return
    if cfg.controller_host:
        settings.ADVERTISE_HOST.set(cfg.controller_host)
        return
    if not node_addr:
        alloc = Allocation.current()
        node_addr = alloc.nodes()[0].addr if alloc is not None else slurmctld_address()
    settings.ADVERTISE_HOST.set(route_address(node_addr))
