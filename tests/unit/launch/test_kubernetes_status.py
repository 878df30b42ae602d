"""Pod status -> proc outcome, and the no-credentials error (pure; no cluster)."""

from __future__ import annotations

import pytest
import yaml

from rlmesh.launch.kubernetes.status import format_events, pod_outcome


def pod(phase="Running", state=None, **status) -> dict:
    cs = [{"name": "worker", "state": state or {"running": {}}}]
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "worker", "resources": {
        "limits": {"memory": "1Gi"}}}]}, "status": {"phase": phase, "containerStatuses": cs, **status}}


def test_running_and_pending_are_not_outcomes():
    assert pod_outcome(pod()) is None
    assert pod_outcome(pod("Pending", {"waiting": {"reason": "ContainerCreating"}})) is None
    assert pod_outcome(pod("Pending", {"waiting": {"reason": "ErrImagePull"}})) is None  # retried once first


def test_exits_keep_code_signal_and_oom_reason():
    assert pod_outcome(pod("Succeeded", {"terminated": {"exitCode": 0, "reason": "Completed"}})).status() == \
        (0, None, "")
    assert pod_outcome(pod("Failed", {"terminated": {"exitCode": 3, "reason": "Error"}})).status() == (3, None, "")
    assert pod_outcome(pod("Failed", {"terminated": {"exitCode": 137, "reason": "Error"}})).status() == \
        (None, 9, "")
    oom = pod_outcome(pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))
    assert oom.signal == 9 and oom.reason.startswith("OOMKilled (memory limit 1Gi")


def test_evicted_deleted_and_gone():
    ev = pod_outcome(pod("Failed", None, reason="Evicted", message="The node was low on resource: memory."))
    assert ev.kind == "failed" and ev.reason == "evicted: The node was low on resource: memory."
    p = pod()
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_outcome(p).kind == "deleted" and "pod deleted" in pod_outcome(p).reason
    assert pod_outcome(None).reason.startswith("pod deleted")
    assert pod_outcome(None, killed=True).signal == 9


def test_fatal_waiting_and_unschedulable():
    out = pod_outcome(pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off"}}))
    assert out.kind == "failed" and out.reason == "image pull failed (ImagePullBackOff: Back-off)"
    p = pod("Pending", None, conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    p["status"]["containerStatuses"] = []
    out = pod_outcome(p)
    assert out.kind == "unschedulable" and "Insufficient nvidia.com/gpu" in out.reason


def test_events_are_summarised_newest_last():
    evs = [{"type": "Warning", "reason": "BackOff", "message": "b", "lastTimestamp": "2026-01-01T00:00:02Z"},
           {"type": "Warning", "reason": "Failed", "message": "a", "lastTimestamp": "2026-01-01T00:00:01Z"},
           {"type": "Normal", "reason": "Scheduled", "message": "ok", "lastTimestamp": "2026-01-01T00:00:03Z"}]
    assert format_events(evs) == "Warning Failed: a; Warning BackOff: b"


def test_no_credentials_says_where_it_looked_and_the_fix(tmp_path, monkeypatch):
    from rlmesh.launch.kubernetes.api import KubernetesCredentialsError, load_api_client

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubernetesCredentialsError) as ei:
        load_api_client()
    msg = str(ei.value)
    assert str(tmp_path / "nope") in msg and "in-cluster" in msg and "launcher.kubeconfig" in msg


def test_unusable_kubeconfig_is_named(tmp_path):
    from rlmesh.launch.kubernetes.api import KubernetesCredentialsError, load_api_client

    bad = tmp_path / "config"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    with pytest.raises(KubernetesCredentialsError, match=str(bad)):
        load_api_client(str(bad))


def test_cli_render_prints_yaml_and_role(capsys):
    from rlmesh.launch.kubernetes.cli import k8s_main

    assert k8s_main(["render", "launcher.image=img:1", "launcher.namespace=rl", "meshes.gen.gpus=1",
                     "--mesh", "gen=2", "--role"]) == 0
    out = capsys.readouterr().out
    assert out.count("kind: Pod") == 2 and "kind: Role" in out and "nvidia.com/gpu: '1'" in out
    assert k8s_main(["render", "launcher.namespace=rl"]) == 2
    assert "launcher.image" in capsys.readouterr().err


def test_cli_render_a_recipe_with_the_kubernetes_launcher(capsys):
    from rlmesh.cli import main

    assert main(["k8s", "render", "recipe=ppo_cartpole", "launcher=kubernetes", "launcher.image=img:1",
                 "launcher.namespace=rl", "--mesh", "pods=3"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Secret", "Pod", "Pod", "Pod"]
    assert {d["metadata"]["namespace"] for d in docs} == {"rl"}
    assert main(["k8s", "render", "recipe=ppo_cartpole", "launcher.image=img:1", "--mesh", "pods=1"]) == 2
    assert "launcher=kubernetes" in capsys.readouterr().err


def test_launch_layer_cli_refuses_a_recipe_without_the_recipe_layer(capsys):
    """The launch layer cannot compose recipes (that would import upward): it says where to go."""
    from rlmesh.launch.kubernetes.cli import k8s_main

    assert k8s_main(["render", "recipe=ppo_cartpole", "launcher=kubernetes", "launcher.image=img:1",
                     "--mesh", "pods=1"]) == 2
    assert "rlmesh k8s render recipe=" in capsys.readouterr().err
