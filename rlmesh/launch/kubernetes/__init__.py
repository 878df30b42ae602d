"""The Kubernetes launcher: worker procs are pods, created through the official client.

    from rlmesh.launch.kubernetes import KubernetesCluster, KubernetesConfig

    cluster = KubernetesCluster(KubernetesConfig(image="ghcr.io/you/rlmesh:0.1", namespace="rl"))
    procs = cluster.spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=3))
    gens = procs.spawn("gen", Generator)          # exactly as with rm.this_host()

One proc = one pod (``restartPolicy: Never``; see ``manifests``): the
controller's supervision, restart policy and telemetry apply unchanged, and a pod
that fails, is evicted or deleted is a dead proc whose ``poll()`` says why.

Per run the launcher creates one Secret (the job's HMAC key, referenced by the pods
through ``secretKeyRef``) that owns every worker pod, so deleting it — ``cluster.close()``,
the end of the program, ``rlmesh k8s cleanup RUN`` — garbage-collects the pods too.
Everything carries ``rlmesh.io/run=<run>``. When the controller itself runs in a pod
(``launcher.controller_pod`` / ``$RLMESH_CONTROLLER_POD``), that pod owns the Secret, so
nothing outlives a deleted controller pod.

Modules, bottom to top (each imports only those above it in this list):
``config`` (settings dataclasses), ``manifests`` (pod/Secret/RBAC objects as dicts),
``status`` (a pod's phase -> a proc's outcome), ``api`` (credentials, errors and their
fixes), ``ops`` (cleanup, server-side dry run), ``pods`` (one pod's watch), ``launcher``
(the controller's ``Launcher`` for pods), ``cluster`` (``KubernetesCluster``), ``cli``
(``rlmesh k8s`` without recipes; the recipe-aware command lives in the recipe layer).
Importing this package does not import the ``kubernetes`` client: only talking to a
cluster does (``pip install rlmesh[kubernetes]``).
"""

from __future__ import annotations

from rlmesh.launch.kubernetes.api import KubernetesCredentialsError, KubernetesError, KubernetesForbidden
from rlmesh.launch.kubernetes.cluster import KubernetesCluster
from rlmesh.launch.kubernetes.config import KubernetesConfig, MeshResources
from rlmesh.launch.kubernetes.launcher import KubernetesLauncher
from rlmesh.launch.kubernetes.manifests import render_manifests
from rlmesh.launch.kubernetes.ops import cleanup_run, dry_run_manifests

__all__ = ["KubernetesCluster", "KubernetesConfig", "KubernetesCredentialsError", "KubernetesError",
           "KubernetesForbidden", "KubernetesLauncher", "MeshResources", "cleanup_run", "dry_run_manifests",
           "render_manifests"]
