"""Pure rendering of the Kubernetes launcher's manifests and its config checks (no cluster)."""

from __future__ import annotations

import pytest
import yaml

from rlmesh.errors import ConfigError
from rlmesh.launch.kubernetes.config import KubernetesConfig, MeshResources
from rlmesh.launch.kubernetes.manifests import (PodProc, deep_merge, dns_name, label_value, pod_manifest,
                                                render_manifests, role_manifests, secret_name, to_yaml)

SECRET = "ab" * 32


def cfg(**kw) -> KubernetesConfig:
    return KubernetesConfig(image="ghcr.io/x/rlmesh:1", **kw)


def proc(**kw) -> PodProc:
    base = dict(proc_id="gen.1", mesh="gen", rank=1, incarnation=2, controller_addr="tcp://10.0.0.5:4000",
                env={"RLMESH_SECRET": SECRET, "RLMESH_JOB_ID": "j1", "RLMESH_TELEMETRY": "tcp://x:1"})
    base.update(kw)
    return PodProc(**base)


def env_of(pod: dict) -> dict:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def test_pod_runs_the_worker_with_the_secret_by_reference_only():
    pod = pod_manifest(cfg(), "run1", proc())
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["python", "-m", "rlmesh.worker", "--controller", "tcp://10.0.0.5:4000", "--proc-id",
                            "gen.1", "--proc-mesh", "gen", "--rank", "1", "--incarnation", "2"]
    assert SECRET not in repr(pod)
    env = env_of(pod)
    assert env["RLMESH_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": secret_name("run1"), "key": "RLMESH_SECRET"}
    assert env["RLMESH_JOB_ID"]["value"] == "j1" and env["RLMESH_TELEMETRY"]["value"] == "tcp://x:1"
    assert env["RLMESH_BIND_HOST"]["value"] == "0.0.0.0"
    assert env["RLMESH_ADVERTISE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert pod["spec"]["restartPolicy"] == "Never"  # restarts are the controller's call
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_controller_env_forwarded_except_its_own_placement_and_secrets():
    from rlmesh.launch.kubernetes.manifests import forwarded_env

    environ = {"RLMESH_LOG_LEVEL": "INFO", "RLMESH_BIND_HOST": "0.0.0.0", "RLMESH_ADVERTISE_HOST": "10.0.0.5",
               "RLMESH_SECRET": SECRET, "RLMESH_TOKEN": "t", "HF_HOME": "/cache", "PATH": "/bin"}
    c = cfg(forward_env=["RLMESH_*", "HF_HOME"], secret_env=["RLMESH_TOKEN"])
    assert forwarded_env(c, environ) == {"RLMESH_LOG_LEVEL": "INFO", "HF_HOME": "/cache"}
    assert forwarded_env(cfg(forward_env=[]), environ) == {}


def test_names_and_labels_identify_run_mesh_rank_incarnation():
    pod = pod_manifest(cfg(labels={"team": "rl"}), "Run_1", proc(mesh="Gen_Pool"))
    assert pod["metadata"]["name"] == "run-1-gen-pool-1-2"
    assert pod["metadata"]["labels"] == {
        "team": "rl", "app.kubernetes.io/managed-by": "rlmesh", "rlmesh.io/run": "Run_1",
        "app.kubernetes.io/name": "rlmesh-worker", "rlmesh.io/mesh": "Gen_Pool", "rlmesh.io/rank": "1",
        "rlmesh.io/incarnation": "2"}
    assert pod["metadata"]["annotations"]["rlmesh.io/proc-id"] == "gen.1"


def test_long_names_stay_valid_dns_labels_and_distinct():
    a, b = dns_name("r" * 80, "gen", "0", "0"), dns_name("r" * 80, "gen", "1", "0")
    assert len(a) <= 63 and len(b) <= 63 and a != b
    assert label_value("--x/y--") == "x-y"


def test_resources_per_mesh_gpu_rdma_and_selectors():
    c = cfg(meshes={"gen": MeshResources(cpu="4", memory="16Gi", gpus=2, rdma=1, node_selector={"pool": "gpu"})},
            node_selector={"zone": "a"}, rdma_resource="rdma/rdma_shared_device_a",
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            service_account="workers")
    pod = pod_manifest(c, "r", proc())
    res = pod["spec"]["containers"][0]["resources"]
    assert res == {"requests": {"cpu": "4", "memory": "16Gi"},
                   "limits": {"memory": "16Gi", "nvidia.com/gpu": "2", "rdma/rdma_shared_device_a": "1"}}
    assert pod["spec"]["nodeSelector"] == {"zone": "a", "pool": "gpu"}
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["spec"]["serviceAccountName"] == "workers"
    other = pod_manifest(c, "r", proc(mesh="trainer"))
    assert "resources" not in other["spec"]["containers"][0]


def test_pod_template_deep_merges_containers_by_name():
    tmpl = {"metadata": {"annotations": {"a": "1"}},
            "spec": {"priorityClassName": "rl", "containers": [
                {"name": "worker", "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                 "env": [{"name": "RLMESH_BIND_HOST", "value": "::"}]}],
                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}], "enableServiceLinks": None}}
    pod = pod_manifest(cfg(pod_template=tmpl), "r", proc())
    c = pod["spec"]["containers"][0]
    assert c["image"] == "ghcr.io/x/rlmesh:1" and c["volumeMounts"][0]["mountPath"] == "/dev/shm"
    assert env_of(pod)["RLMESH_BIND_HOST"]["value"] == "::"  # env merges by name too
    assert pod["spec"]["priorityClassName"] == "rl" and "enableServiceLinks" not in pod["spec"]
    assert pod["metadata"]["annotations"]["a"] == "1" and "rlmesh.io/proc-id" in pod["metadata"]["annotations"]
    assert deep_merge({"l": [1, 2]}, {"l": [3]}) == {"l": [3]}  # plain lists are replaced


def test_render_has_secret_placeholder_and_every_rank():
    objs = render_manifests(cfg(meshes={"trainer": MeshResources(replicas=1)}), {"gen": 2, "trainer": 0}, run="r")
    assert [o["kind"] for o in objs] == ["Secret", "Pod", "Pod", "Pod"]
    assert [o["metadata"]["name"] for o in objs[1:]] == ["r-gen-0-0", "r-gen-1-0", "r-trainer-0-0"]
    assert "generated by the controller" in objs[0]["stringData"]["RLMESH_SECRET"]
    text = to_yaml(objs)
    assert list(yaml.safe_load_all(text)) == objs and text.startswith("apiVersion: v1\nkind: Secret")


def test_role_covers_what_the_launcher_calls():
    sa, role, binding = role_manifests("rl")
    rules = {r["resources"][0]: set(r["verbs"]) for r in role["rules"]}
    assert {"create", "delete", "watch", "list", "get"} <= rules["pods"]
    assert {"create", "get", "update", "delete"} <= rules["secrets"]
    assert binding["subjects"][0]["name"] == sa["metadata"]["name"] and role["metadata"]["namespace"] == "rl"


@pytest.mark.parametrize("kw,field", [
    ({"image": ""}, "launcher.image"),
    ({"namespace": "Bad_NS"}, "launcher.namespace"),
    ({"image_pull_policy": "Sometimes"}, "launcher.image_pull_policy"),
    ({"meshes": {"gen": {"cpu": "lots"}}}, "launcher.meshes.gen.cpu"),
    ({"meshes": {"gen": {"gpu": 1}}}, "unknown key(s) ['gpu']"),
    ({"env": {"RLMESH_SECRET": "x"}}, "launcher.env"),
    ({"tolerations": [{"key": "a", "tolerance": 1}]}, "launcher.tolerations[0]"),
    ({"pod_template": {"containers": []}}, "launcher.pod_template"),
    ({"run": "a b"}, "launcher.run"),
])
def test_bad_settings_name_the_key(kw, field):
    base = {"image": "img", **kw}
    with pytest.raises(ConfigError) as ei:
        KubernetesConfig(**base)
    assert field in str(ei.value)


def test_from_dict_rejects_unknown_keys_and_builds_meshes():
    c = KubernetesConfig.from_dict({"image": "i", "meshes": {"gen": {"replicas": 3, "gpus": 1}}})
    assert c.meshes["gen"] == MeshResources(replicas=3, gpus=1)
    with pytest.raises(ConfigError, match="imagee"):
        KubernetesConfig.from_dict({"imagee": "i"})


def test_config_is_a_hydra_structured_config():
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(KubernetesConfig(image="i"))
    merged = OmegaConf.merge(schema, OmegaConf.create({"meshes": {"gen": {"replicas": 2, "gpus": 1}}}))
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, KubernetesConfig) and obj.meshes["gen"].gpus == 1


def test_preset_yaml_loads_into_the_config():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "configs/launcher/kubernetes.yaml"
    data = yaml.safe_load(path.read_text())
    c = KubernetesConfig.from_dict({**data, "image": "i" if data["image"] == "???" else data["image"]})
    assert c.namespace and "RLMESH_SECRET" in c.secret_env


def test_from_dict_takes_an_omegaconf_launcher_group():
    from omegaconf import OmegaConf

    group = OmegaConf.create({"image": "i", "tolerations": [{"key": "gpu", "operator": "Exists"}],
                              "pod_template": {"spec": {"priorityClassName": "rl"}},
                              "meshes": {"gen": {"replicas": 2}}, "secret_env": ["HF_TOKEN"]})
    c = KubernetesConfig.from_dict(group)
    assert type(c.tolerations[0]) is dict and type(c.pod_template) is dict and c.meshes["gen"].replicas == 2
    assert c.secret_env == ["RLMESH_SECRET", "HF_TOKEN"]
    from rlmesh.launch.kubernetes.manifests import pod_manifest as render

    assert render(c, "r", proc())["spec"]["priorityClassName"] == "rl"
