"""What goes wrong, said clearly, against the real API server: RBAC refusal (with the Role),
image pull failure and unschedulable pods (with their events), and server-side dry runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

import rlmesh as rm
from rlmesh.launch.kubernetes import (KubernetesCluster, KubernetesConfig, KubernetesError, KubernetesForbidden,
                                      MeshResources, dry_run_manifests, render_manifests)
from rlmesh.launch.kubernetes.manifests import run_selector

pytestmark = pytest.mark.timeout(90)
IMAGE = "rlmesh-test:local"


def nothing_left(k8s, run: str) -> bool:
    sel = run_selector(run)
    return not k8s.core.list_namespaced_pod(k8s.namespace, label_selector=sel).items and \
        not k8s.core.list_namespaced_secret(k8s.namespace, label_selector=sel).items


def test_rbac_forbidden_names_the_role_needed_and_creates_nothing(k8s):
    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-rbac",
                           kubeconfig=str(k8s.plane.limited_kubeconfig))
    cluster = KubernetesCluster(cfg)
    try:
        with pytest.raises(KubernetesForbidden) as ei:
            cluster.spawn_procs(per_host={"procs": 1}, name="k8s-denied")
    finally:
        cluster.close()
    msg = str(ei.value)
    assert "forbidden" in msg and "rlmesh-limited" in msg and 'cannot create resource "pods"' in msg
    role = [d for d in yaml.safe_load_all(msg.split("\n\n", 1)[1]) if d and d["kind"] == "Role"][0]
    assert role["metadata"]["namespace"] == k8s.namespace
    assert any("pods" in r["resources"] and "create" in r["verbs"] for r in role["rules"])
    assert nothing_left(k8s, "it-rbac")


def test_image_pull_failure_fails_the_spawn_with_the_pod_events(k8s):
    cfg = KubernetesConfig(image="unpullable.example/rlmesh:nope", namespace=k8s.namespace, run="it-pull")
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        with pytest.raises(rm.ActorDied) as ei:
            cluster.spawn_procs(per_host={"procs": 1}, name="k8s-pull", timeout=30)
        msg = str(ei.value)
        assert "image pull failed (ImagePullBackOff" in msg
        assert 'Failed to pull image "unpullable.example/rlmesh:nope"' in msg  # from the pod's events
    assert nothing_left(k8s, "it-pull")


def test_unschedulable_pod_fails_with_the_schedulers_reason(k8s):
    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-sched", unschedulable_timeout_s=1.0,
                           meshes={"k8s-big": MeshResources(gpus=8)})
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        with pytest.raises(rm.ActorDied) as ei:
            cluster.spawn_procs(per_host={"procs": 1}, name="k8s-big", timeout=30)
    msg = str(ei.value)
    assert "unschedulable: 0/1 nodes are available" in msg and "nvidia.com/gpu" in msg
    assert "FailedScheduling" in msg
    assert nothing_left(k8s, "it-sched")


def test_rendered_manifests_pass_a_server_side_dry_run(k8s):
    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-render",
                           meshes={"gen": MeshResources(replicas=2, cpu="500m", memory="1Gi", gpus=1, rdma=1)},
                           tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                           pod_template={"spec": {"priorityClassName": "system-cluster-critical"}})
    objs = render_manifests(cfg, {"gen": 0, "trainer": 1})
    assert [o["kind"] for o in objs] == ["Secret", "Pod", "Pod", "Pod"]
    dry_run_manifests(k8s.core, objs)
    assert nothing_left(k8s, "it-render")  # a dry run stores nothing
    bad = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-render",
                           pod_template={"spec": {"restartPolicy": "Sometimes"}})
    with pytest.raises(KubernetesError) as ei:
        dry_run_manifests(k8s.core, render_manifests(bad, {"gen": 1}))
    assert "spec.restartPolicy" in str(ei.value) and "Sometimes" in str(ei.value)


def test_cli_render_validate_against_the_server(k8s):
    base = [sys.executable, "-m", "rlmesh.cli", "k8s", "render", f"launcher.image={IMAGE}",
            f"launcher.namespace={k8s.namespace}", "--mesh", "gen=2", "--validate",
            "--kubeconfig", str(k8s.plane.admin_kubeconfig)]
    ok = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "3 object(s) accepted by the API server" in ok.stderr
    assert [d["kind"] for d in yaml.safe_load_all(ok.stdout)] == ["Secret", "Pod", "Pod"]
    bad = subprocess.run([*base, "launcher.pod_template.spec.dnsPolicy=Sometimes"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "spec.dnsPolicy" in bad.stderr
