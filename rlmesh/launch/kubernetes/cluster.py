"""``KubernetesCluster``: a namespace as a place to spawn procs, the pod counterpart of ``rm.this_host()``."""

from __future__ import annotations

import itertools
import logging
import os
import uuid
from typing import Any

from rlmesh import settings
from rlmesh.actor.controller import Controller, LaunchRequest, Restart
from rlmesh.actor.proc_mesh import ProcMesh
from rlmesh.errors import ConfigError
from rlmesh.launch.admission import PROC_BYTES, ClusterCapacity, ProcDemand, admit_cluster, quantity
from rlmesh.launch.cluster import RemoteCluster
from rlmesh.launch.kubernetes.api import KubernetesError, explain, kubernetes_client, load_api_client
from rlmesh.launch.kubernetes.config import KubernetesConfig
from rlmesh.launch.kubernetes.launcher import KubernetesLauncher
from rlmesh.launch.kubernetes.manifests import LABEL_MESH, label_value, render_manifests, run_selector
from rlmesh.launch.kubernetes.ops import cleanup_run
from rlmesh.transport.auth import SECRET_ENV

__all__ = ["KubernetesCluster"]

logger = logging.getLogger(__name__)


class KubernetesCluster(RemoteCluster[KubernetesLauncher]):
    """A Kubernetes namespace as a place to spawn procs on: the pod counterpart of ``rm.this_host()``.

    ``config``: a :class:`KubernetesConfig` or a mapping of its fields (a Hydra ``launcher``
    group); keyword ``overrides`` replace single fields. ``api_client``: an existing
    ``kubernetes.client.ApiClient`` (else one from the kubeconfig / in-cluster credentials).
    """

    _names = itertools.count()

    def __init__(self, config: KubernetesConfig | dict[str, Any] | None = None, *, api_client: Any = None,
                 **overrides: Any):
        if isinstance(config, KubernetesConfig):
            base = {f: getattr(config, f) for f in config.__dataclass_fields__}
        else:
            base = dict(config or {})
        self.config = KubernetesConfig.from_dict({**base, **overrides})
        self.api = api_client or load_api_client(self.config.kubeconfig, self.config.context)
        self.core = kubernetes_client().client.CoreV1Api(self.api)
        job = settings.JOB_ID.setdefault(uuid.uuid4().hex[:12])  # the controller adopts the same id
        self.run = self.config.run or label_value(f"rlmesh-{job}")
        self.launcher = KubernetesLauncher(self.config, self.core, self.run)
        self._checked_leftovers = False
        self._close_at_exit()

    def spawn_procs(self, per_host: dict[str, int] | None = None, *, restart: Restart | None = None,
                    name: str | None = None, env: dict[str, str] | None = None,
                    timeout: float | None = None) -> ProcMesh:
        """Start worker pods laid out as ``per_host`` (default ``{"procs": launcher.meshes[name].replicas}``).

        Same signature and result as ``HostMesh.spawn_procs``; ``name`` (default ``pods``,
        ``pods1``, ...) names the proc mesh, its pods and its ``launcher.meshes`` entry. Before any pod exists it
        checks, on this thread: credentials, RBAC (a refusal prints the Role needed), leftover
        pods of the same run, and the pod manifest (server-side dry run). A pod that cannot be
        pulled or scheduled fails the spawn with the pod's events in the error.
        """
        if name is None:  # "pods", "pods1", ...: never the "procs" of a local mesh in the same controller
            n_ = next(KubernetesCluster._names)
            name = "pods" if n_ == 0 else f"pods{n_}"
        want = self.config.resources_for(name).replicas
        dims = dict(per_host or {"procs": want or 1})
        if not dims:
            raise ValueError("per_host needs at least one dimension, e.g. per_host={'procs': 4}")
        n = 1
        for size in dims.values():
            n *= size
        if want and n != want:
            raise ConfigError(f"launcher.meshes.{name}.replicas={want} but spawn_procs asks for {n} procs "
                              f"({dims}); make them agree or set replicas to 0")
        cap = self.capacity(name)
        if cap is not None:  # before the controller or any pod starts
            admit_cluster(f"spawn_procs(per_host={dims})", n, self.demand(name),
                          [self.demand(m) for m in self._running_meshes()], cap,
                          f"spawn fewer pods, or lower what each asks for ({self._key(name, 'memory')}, "
                          f"{self._key(name, 'cpu')})")
        Controller.get()  # makes the job secret if there is none yet
        self._preflight(name, env or {})
        try:
            return self._launch(name, dims, restart, env, timeout)
        except BaseException:
            self._delete_mesh_pods(name)
            raise

    def capacity(self, mesh: str) -> ClusterCapacity | None:
        """The allocatable CPU, memory and pods of the nodes ``mesh``'s pods may go to (schedulable,
        Ready, carrying its node selector's labels), summed, from the API server; None (admission
        skipped, one log line) where this identity may not list nodes (a namespaced Role cannot
        grant it: nodes are cluster-wide)."""
        selector = {**self.config.node_selector, **self.config.resources_for(mesh).node_selector}
        try:
            nodes = self.core.list_node(_request_timeout=30).items
        except Exception as exc:  # noqa: BLE001  # a guard, not a requirement: never stops a spawn by itself
            logger.info("cannot list the cluster's nodes (%s): a mesh's size is not checked against them "
                        "(a ClusterRole with get/list on nodes enables it)", str(exc).splitlines()[0][:200])
            return None
        cpus = memory = 0.0
        pods = count = 0
        for node in nodes:
            status = node.status
            if (node.spec is not None and node.spec.unschedulable) or status is None:
                continue
            if not any(c.type == "Ready" and c.status == "True" for c in status.conditions or []):
                continue
            labels = node.metadata.labels or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                continue
            alloc = status.allocatable or {}
            cpus += quantity(alloc.get("cpu", "0"))
            memory += quantity(alloc.get("memory", "0"))
            pods += int(quantity(alloc.get("pods", "0")))
            count += 1
        where = f"the {count} schedulable Ready node{'' if count == 1 else 's'}" + (
            f" labelled {selector}" if selector else "") + " of the cluster"
        return ClusterCapacity(cpus, int(memory), pods, where)

    def demand(self, mesh: str) -> ProcDemand:
        """What one pod of ``mesh`` asks the scheduler for (memory: its request, else the 256 MiB a recipe
        proc takes)."""
        res = self.config.resources_for(mesh)
        return ProcDemand(memory=int(quantity(res.memory)) if res.memory else PROC_BYTES,
                          cpus=quantity(res.cpu) if res.cpu else 0.0,
                          memory_key=self._key(mesh, "memory") if res.memory else "",
                          cpu_key=self._key(mesh, "cpu"))

    def _key(self, mesh: str, field: str) -> str:
        return f"launcher.meshes.{mesh}.{field}" if mesh in self.config.meshes else f"launcher.default_resources.{field}"

    def _preflight(self, mesh: str, env: dict[str, str]) -> None:
        """Checks before the first pod: dry-run a pod (RBAC, schema, admission), leftovers, the watch,
        then the Secret, in that order so that a refused identity creates nothing."""
        probe = LaunchRequest("tcp://127.0.0.1:1", f"{mesh}.0", mesh, 0, 0, {SECRET_ENV: "x", **env})
        self.launcher.validate(self.launcher.manifest(probe))
        if not self._checked_leftovers:
            try:
                left = self.launcher.leftover_pods()
            except Exception as exc:
                raise explain(exc, "listing pods", self.config.namespace) from exc
            if left:
                raise KubernetesError(
                    f"run {self.run!r} already has {len(left)} pod(s) in namespace {self.config.namespace!r} "
                    f"({', '.join(sorted(left)[:5])}): a leftover of a crashed controller? Remove them with "
                    f"`rlmesh k8s cleanup {self.run} --namespace {self.config.namespace}`, or set launcher.run")
            self._checked_leftovers = True
        self.launcher.start_watch()
        secret_values = {**os.environ, **env}
        data = {k: secret_values[k] for k in self.config.secret_env if k in secret_values}
        self.launcher.ensure_secret({**self.launcher.secret_data, **data})

    def _delete_mesh_pods(self, mesh: str) -> None:
        sel = f"{run_selector(self.run)},{LABEL_MESH}={label_value(mesh)}"
        try:
            self.core.delete_collection_namespaced_pod(self.config.namespace, label_selector=sel,
                                                       grace_period_seconds=0, _request_timeout=30)
        except Exception as exc:  # noqa: BLE001 - best effort after a failed spawn
            logger.warning("removing the pods of failed mesh %s: %s", mesh, exc)

    def render(self, meshes: dict[str, int] | None = None) -> list[dict[str, Any]]:
        """The manifests this cluster would create for ``meshes`` (``{name: size}``)."""
        return render_manifests(self.config, meshes, run=self.run)

    def cleanup(self) -> dict[str, int]:
        """Delete everything of this run now (pods and the Secret), as ``rlmesh k8s cleanup RUN`` does."""
        return cleanup_run(self.core, self.config.namespace, self.run)

    def __repr__(self) -> str:
        return f"<KubernetesCluster run={self.run!r} namespace={self.config.namespace!r}>"
