"""``KubernetesConfig``: where and how worker pods run (the ``launcher=kubernetes`` settings).

Plain dataclasses with a docstring per field, importing nothing from the
``kubernetes`` client, so Hydra can register them in a ConfigStore and a bad value
fails in ``__post_init__`` before any pod is created. Messages name the key as
``launcher.<field>`` (its path in a recipe config) and say how to fix it. Types
stay within what OmegaConf accepts (no ``Literal``, no unions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from collections.abc import Mapping, Sequence
from typing import Any, Dict, List

from rlmesh import settings
from rlmesh.errors import ConfigError

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]+)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}


def _check(ok: bool, key: str, value: object, fix: str) -> None:
    if not ok:
        raise ConfigError(f"launcher.{key}={value!r} is invalid: {fix}")


@dataclass
class MeshResources:
    """What each pod of one proc mesh asks the scheduler for."""

    replicas: int = 0
    """Pods in the mesh when the program does not say (``spawn_procs()`` without ``per_host``,
    ``rlmesh k8s render``); 0 = take the size from the program (1 if it gives none)."""
    cpu: str = ""
    """CPU request per pod as a Kubernetes quantity (``"4"``, ``"500m"``); empty = none. No CPU
    limit is set: throttling a generator mid-rollout costs more than it protects."""
    memory: str = ""
    """Memory request and limit per pod (``"16Gi"``); empty = none. Going over the limit ends the
    proc with reason ``OOMKilled``."""
    gpus: int = 0
    """GPUs per pod, requested as ``launcher.gpu_resource`` (``nvidia.com/gpu``)."""
    rdma: int = 0
    """RDMA devices per pod, requested as ``launcher.rdma_resource``; needs an RDMA device plugin."""
    node_selector: Dict[str, str] = field(default_factory=dict)
    """Node labels this mesh's pods need, on top of ``launcher.node_selector``."""

    def validate(self, where: str) -> None:
        _check(self.replicas >= 0, f"{where}.replicas", self.replicas, "use 0 (from the program) or more")
        for name in ("cpu", "memory"):
            v = getattr(self, name)
            _check(v == "" or bool(_QUANTITY.match(str(v))), f"{where}.{name}", v,
                   "use a Kubernetes quantity such as '2', '500m', '16Gi', or '' for none")
        _check(self.gpus >= 0, f"{where}.gpus", self.gpus, "use 0 or more GPUs per pod")
        _check(self.rdma >= 0, f"{where}.rdma", self.rdma, "use 0 or more RDMA devices per pod")


@dataclass
class KubernetesConfig:
    """Settings of the Kubernetes launcher: one worker proc = one pod in ``namespace``."""

    image: str = ""
    """Container image with rlmesh (and the user's actor code) installed; required."""
    namespace: str = "default"
    """Namespace of every object the launcher creates (pods and the run's Secret)."""
    image_pull_policy: str = "IfNotPresent"
    """``Always``, ``IfNotPresent`` or ``Never``."""
    python: str = "python"
    """Interpreter inside the image; pods run ``<python> -m rlmesh.worker ...``."""
    run: str = ""
    """Value of the ``rlmesh.io/run`` label on everything created (``rlmesh k8s cleanup RUN``);
    empty = ``rlmesh-<job id>``."""
    meshes: Dict[str, MeshResources] = field(default_factory=dict)
    """Per proc-mesh size and resources, by mesh name (the ``name=`` of ``spawn_procs``)."""
    default_resources: MeshResources = field(default_factory=MeshResources)
    """Resources of meshes not listed in ``meshes``."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource name that ``gpus`` requests."""
    rdma_resource: str = "rdma/hca"
    """Extended resource name that ``rdma`` requests (as your RDMA device plugin names it,
    e.g. ``rdma/rdma_shared_device_a`` with the NVIDIA network operator)."""
    node_selector: Dict[str, str] = field(default_factory=dict)
    """Node labels every worker pod needs."""
    tolerations: List[Dict[str, Any]] = field(default_factory=list)
    """Pod tolerations, as in a pod spec (``{key, operator, value, effect, tolerationSeconds}``)."""
    service_account: str = ""
    """ServiceAccount of the worker pods; empty = the namespace's ``default``. Workers do not
    call the API, so no token is mounted unless ``pod_template`` asks for one."""
    env: Dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the workers (in clear text in the pod spec: no secrets)."""
    forward_env: List[str] = field(default_factory=lambda: [f"{settings.PREFIX}*"])
    """Controller environment variables copied into the pods (``fnmatch`` patterns), so settings
    like ``RLMESH_LOG_LEVEL`` or ``RLMESH_HEARTBEAT_S`` reach workers as they do local procs.
    Never copied: the controller's own network and pod settings, and ``secret_env``."""
    secret_env: List[str] = field(default_factory=lambda: [settings.SECRET.name])
    """Variables of the workers' environment that travel through the run's Secret
    (``valueFrom.secretKeyRef``) instead of the pod spec. ``RLMESH_SECRET`` always does."""
    labels: Dict[str, str] = field(default_factory=dict)
    """Extra labels on every object (the ``rlmesh.io/*`` ones are always set)."""
    annotations: Dict[str, str] = field(default_factory=dict)
    """Extra annotations on every pod."""
    pod_template: Dict[str, Any] = field(default_factory=dict)
    """Deep-merged over each rendered pod (``{"metadata": ..., "spec": ...}``) for anything
    not covered here; containers merge by name (the worker container is ``worker``)."""
    bind_host: str = "0.0.0.0"
    """``RLMESH_BIND_HOST`` in the pods, so peers can reach a worker's sockets; each worker
    advertises its pod IP (downward API). Empty = loopback only (single-pod tests)."""
    controller_pod: str = ""
    """Name of the pod the controller itself runs in; that pod then owns the run's Secret, and
    deleting it garbage-collects every worker pod. Empty = ``$RLMESH_CONTROLLER_POD`` if set."""
    unschedulable_timeout_s: float = 30.0
    """A pod the scheduler cannot place for this long is a failed proc (with the scheduler's
    events in the reason) instead of a silent wait."""
    termination_grace_s: int = 20
    """Seconds a deleted pod gets between SIGTERM and SIGKILL (actors' ``on_stop`` run in it)."""
    keep_failed_pods: bool = False
    """Leave failed pods in place for ``kubectl logs`` (``rlmesh k8s cleanup`` removes them)."""
    kubeconfig: str = ""
    """Kubeconfig file; empty = ``$KUBECONFIG`` or ``~/.kube/config``, else in-cluster credentials."""
    context: str = ""
    """Kubeconfig context; empty = its current context."""

    def __post_init__(self) -> None:
        self.meshes = {str(k): _as_resources(v) for k, v in dict(self.meshes).items()}
        self.default_resources = _as_resources(self.default_resources)
        _check(bool(self.image) and self.image != "???", "image", self.image,
               "set it to an image with rlmesh installed, e.g. launcher.image=ghcr.io/you/rlmesh:0.1.0")
        _check(bool(_DNS_LABEL.match(self.namespace)), "namespace", self.namespace,
               "use a DNS label: lowercase letters, digits and '-', at most 63 characters")
        _check(self.image_pull_policy in _PULL_POLICIES, "image_pull_policy", self.image_pull_policy,
               f"use one of {', '.join(_PULL_POLICIES)}")
        _check(bool(self.python), "python", self.python, "name the interpreter in the image, e.g. 'python3'")
        _check(bool(_LABEL_VALUE.match(self.run)), "run", self.run,
               "use a label value: letters, digits, '-', '_', '.', at most 63 characters")
        for name, res in self.meshes.items():
            _check(bool(re.match(r"^[A-Za-z0-9][-A-Za-z0-9_.]*$", name)), "meshes", name,
                   "mesh names are letters, digits, '-', '_' and '.'")
            res.validate(f"meshes.{name}")
        self.default_resources.validate("default_resources")
        if any(r.rdma for r in [self.default_resources, *self.meshes.values()]):
            _check(bool(self.rdma_resource), "rdma_resource", self.rdma_resource,
                   "name the RDMA device plugin's resource, e.g. 'rdma/hca'")
        for i, tol in enumerate(self.tolerations):
            _check(isinstance(tol, dict) and set(tol) <= _TOLERATION_KEYS, f"tolerations[{i}]", tol,
                   f"a toleration is a mapping with keys among {sorted(_TOLERATION_KEYS)}")
        for k in self.env:
            _check(bool(_ENV_NAME.match(k)), "env", k, "environment variable names are letters, digits, '_'")
            _check(k not in self.secret_env and k != settings.SECRET.name, "env", k,
                   "secrets do not go in launcher.env (clear text); list the name in launcher.secret_env")
        if settings.SECRET.name not in self.secret_env:
            self.secret_env = [settings.SECRET.name, *self.secret_env]
        _check(isinstance(self.pod_template, dict) and set(self.pod_template) <= {"metadata", "spec"},
               "pod_template", self.pod_template, "give a mapping with 'metadata' and/or 'spec' keys")
        _check(self.unschedulable_timeout_s > 0, "unschedulable_timeout_s", self.unschedulable_timeout_s,
               "use a number of seconds > 0")
        _check(self.termination_grace_s >= 0, "termination_grace_s", self.termination_grace_s, "use 0 or more")

    def resources_for(self, mesh: str) -> MeshResources:
        """The resources of ``mesh`` (``meshes[mesh]`` or ``default_resources``)."""
        return self.meshes.get(mesh, self.default_resources)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KubernetesConfig":
        """Build from a mapping (a YAML preset, a Hydra ``launcher`` group, even an OmegaConf
        ``DictConfig``: nested containers become plain dicts and lists); unknown keys fail."""
        data = _plain(data)
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ConfigError(f"launcher: unknown key(s) {extra}; valid keys are {sorted(known)}")
        return cls(**data)


def _plain(v: Any) -> Any:
    """Mappings and sequences (OmegaConf's included) as plain dicts and lists, recursively."""
    if isinstance(v, (MeshResources, KubernetesConfig)):
        return v
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, Sequence) and not isinstance(v, (str, bytes)):
        return [_plain(x) for x in v]
    return v


def _as_resources(v: Any) -> MeshResources:
    if isinstance(v, MeshResources):
        return v
    if isinstance(v, dict):
        known = {f.name for f in fields(MeshResources)}
        extra = sorted(set(v) - known)
        if extra:
            raise ConfigError(f"launcher.meshes: unknown key(s) {extra}; valid keys are {sorted(known)}")
        return MeshResources(**v)
    if hasattr(v, "keys"):  # an OmegaConf DictConfig
        return _as_resources({k: v[k] for k in v.keys()})
    raise ConfigError(f"launcher.meshes: {v!r} is not a mapping of resources (replicas, cpu, memory, gpus, rdma)")
