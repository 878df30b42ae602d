"""Run-level Kubernetes operations shared by the launcher and ``rlmesh k8s``: cleanup, dry-run.

Both work from labels and manifests alone, so they serve a live controller, an operator
after a crash (``rlmesh k8s cleanup RUN``) and a GitOps review (``rlmesh k8s render --validate``).
"""

from __future__ import annotations

import time
from typing import Any

from rlmesh.launch.kubernetes.api import KubernetesError, explain
from rlmesh.launch.kubernetes.manifests import run_selector


def run_objects(core: Any, namespace: str, run: str) -> dict[str, list[str]]:
    """Names of the run's pods and Secrets (everything the launcher creates)."""
    sel = run_selector(run)
    try:
        pods = core.list_namespaced_pod(namespace, label_selector=sel, _request_timeout=30).items
        secrets = core.list_namespaced_secret(namespace, label_selector=sel, _request_timeout=30).items
    except Exception as exc:
        raise explain(exc, f"listing the objects of run {run!r}", namespace) from exc
    return {"pods": [p.metadata.name for p in pods], "secrets": [s.metadata.name for s in secrets]}


def cleanup_run(core: Any, namespace: str, run: str, grace_s: int = 0, wait_s: float = 0.0) -> dict[str, int]:
    """Delete every pod and Secret labelled ``rlmesh.io/run=<run>``; returns how many of each.

    ``grace_s``: the pods' termination grace (0 = kill now). ``wait_s`` > 0: block until the
    API lists none of them any more (a pod with a grace period lingers while it stops).
    """
    sel = run_selector(run)
    found = run_objects(core, namespace, run)
    try:
        if found["pods"]:
            core.delete_collection_namespaced_pod(namespace, label_selector=sel, grace_period_seconds=grace_s,
                                                  _request_timeout=30)
        if found["secrets"]:
            core.delete_collection_namespaced_secret(namespace, label_selector=sel, _request_timeout=30)
    except Exception as exc:
        raise explain(exc, f"cleaning up run {run!r}", namespace) from exc
    deadline = time.monotonic() + wait_s
    while wait_s > 0:
        left = run_objects(core, namespace, run)
        if not left["pods"] and not left["secrets"]:
            break
        if time.monotonic() > deadline:
            raise KubernetesError(f"run {run!r}: still present after {wait_s:.0f}s: {left} (a node that is down "
                                  f"cannot confirm its pods' end; `kubectl delete pod --force` them)")
        time.sleep(0.2)
    return {"pods": len(found["pods"]), "secrets": len(found["secrets"])}


def dry_run_manifests(core: Any, objs: list[dict[str, Any]]) -> None:
    """Server-side dry run (``dryRun=All``) of rendered Pods and Secrets: admission, schema and RBAC are
    checked by the API server, nothing is persisted. Raises :class:`KubernetesError` on the first refusal."""
    for obj in objs:
        ns = obj["metadata"].get("namespace", "default")
        what = f"{obj['kind']} {obj['metadata']['name']} (server-side dry run)"
        try:
            if obj["kind"] == "Pod":
                core.create_namespaced_pod(ns, obj, dry_run="All", _request_timeout=30)
            elif obj["kind"] == "Secret":
                core.create_namespaced_secret(ns, obj, dry_run="All", _request_timeout=30)
            else:
                raise KubernetesError(f"dry run of kind {obj['kind']} is not supported (only Pod and Secret)")
        except KubernetesError:
            raise
        except Exception as exc:
            raise explain(exc, f"creating {what}", ns) from exc
