"""What goes wrong, said clearly, against the real API server: RBAC refusal (with the Role),
image pull failure and unschedulable pods (with their events), and server-side dry runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

import rlmesh as rm
from rlmesh.errors import ConfigError
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


def test_a_mesh_beyond_the_nodes_allocatable_is_refused_in_one_line_before_any_pod(k8s, monkeypatch):
    # Such a mesh would sit Pending until the start timeout, minutes later, with no word on why.
    monkeypatch.delenv("RLMESH_MAX_PROCS", raising=False)
    cfg = KubernetesConfig(image=IMAGE, namespace=k8s.namespace, run="it-admit",
                           meshes={"k8s-fat": MeshResources(memory="16Gi"), "k8s-cpu": MeshResources(cpu="4"),
                                   "k8s-zone": MeshResources(node_selector={"zone": "nowhere"})})
    with KubernetesCluster(cfg, api_client=k8s.api) as cluster:
        cap = cluster.capacity("k8s-fat")  # the fake node's allocatable, as the API server reports it
        assert cap is not None and (cap.cpus, cap.memory, cap.slots) == (16, 64 << 30, 110)
        refusals = {}
        for name, n in (("k8s-fat", 5), ("k8s-cpu", 5), ("pods", 111), ("k8s-zone", 1)):
            with pytest.raises(ConfigError) as ei:
                cluster.spawn_procs(per_host={"procs": n}, name=name)
            refusals[name] = str(ei.value)
        assert cluster.capacity("pods") == cap  # 4 refusals, nothing counted as running
    node = "the 1 schedulable Ready node of the cluster"
    assert refusals["k8s-fat"] == (
        f"spawn_procs(per_host={{'procs': 5}}) needs 80.0 GiB of memory for 5 procs at 16.0 GiB a proc "
        f"(launcher.meshes.k8s-fat.memory), more than the 64.0 GiB of {node}; spawn fewer pods, or lower what "
        f"each asks for (launcher.meshes.k8s-fat.memory, launcher.meshes.k8s-fat.cpu), or set RLMESH_MAX_PROCS=5 "
        f"to start them anyway")
    assert "20 CPUs for 5 procs at 4 a proc (launcher.meshes.k8s-cpu.cpu), more than the 16 of " + node \
        in refusals["k8s-cpu"]
    assert f"111 pods, more than the 110 pod slots of {node}" in refusals["pods"]
    assert "the 0 schedulable Ready nodes labelled {'zone': 'nowhere'} of the cluster" in refusals["k8s-zone"]
    assert all("\n" not in r and "RLMESH_MAX_PROCS=" in r for r in refusals.values())
    assert nothing_left(k8s, "it-admit")


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
