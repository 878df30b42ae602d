"""The cluster fixture: a real kube-apiserver (+ etcd, controller manager, scheduler) on loopback,
one registered Node whose kubelet is played by :mod:`fake_kubelet`.

Started by the first test that needs it (~5-10 s) and stopped after the last of a row of them
(tests/conftest.py keeps these files in a row, on one xdist worker). Skips the suite, with the reason, when the binaries
are not cached: ``bash scripts/k8s_build.sh`` builds them (~12 min on 2 cores) into
``~/.cache/rlmesh/k8s/bin`` (or ``$RLMESH_K8S_BIN``); set ``RLMESH_K8S_BUILD=1`` to let
the fixture run the build itself.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from control_plane import LIMITED_USER, ControlPlane, bin_dir, missing_binaries  # beside this file: pyproject's pythonpath
from fake_kubelet import FakeKubelet

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

NAMESPACE = "rlmesh-it"
NODE = "rlmesh-fake-node"


@dataclass
class K8s:
    plane: ControlPlane
    api: Any
    core: Any
    namespace: str
    kubelet: FakeKubelet
    timings: dict[str, float] = field(default_factory=dict)


def _wait(pred, timeout: float, what: str, plane: ControlPlane) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except Exception:  # noqa: BLE001 - not yet
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} not reached in {timeout}s\ncontroller-manager log:\n"
                       f"{plane.log_tail('kube-controller-manager')}\n"
                       f"scheduler log:\n{plane.log_tail('kube-scheduler')}")


def pytest_configure(config: Any) -> None:
    """RLMESH_K8S_BUILD=1: build missing binaries now, at collection, outside any test's timeout."""
    if missing_binaries() and os.environ.get("RLMESH_K8S_BUILD") == "1":
        subprocess.run(["nice", "-n", "10", "bash", str(ROOT / "scripts/k8s_build.sh")], check=False)


_cluster: K8s | None = None  # the running cluster of this pytest process, if any


def _start_cluster(tmp_path_factory: Any) -> K8s:
    missing = missing_binaries()
    if missing:
        # The README's test command builds them (scripts/test.sh), so under CI a missing binary is a
        # broken set-up, not absent hardware: fail loudly instead of skipping 14 tests quietly.
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"Kubernetes binaries {missing} not found in {bin_dir()}: run `bash scripts/k8s_build.sh` "
                    f"(builds them from Debian's kubernetes source package, ~12 min on 2 cores) or set "
                    f"RLMESH_K8S_BUILD=1")
    from kubernetes import client, config

    plane = ControlPlane()
    t0 = time.monotonic()
    try:
        plane.start()
        api = config.new_client_from_config(config_file=str(plane.admin_kubeconfig))
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        kubelet = FakeKubelet(core, NODE, tmp_path_factory.mktemp("kubelet"), [str(HERE), str(ROOT)])
        kubelet.register_node()
        kubelet.start()
        # Pods are refused until the ServiceAccount controller made the namespace's "default" account.
        _wait(lambda: core.read_namespaced_service_account("default", NAMESPACE), 60,
              "the default ServiceAccount", plane)
        _bind_limited_role(api)
    except BaseException:
        plane.stop()
        raise
    env = K8s(plane, api, core, NAMESPACE, kubelet)
    env.timings["apiserver_ready_s"] = plane.startup_s["apiserver_ready"]
    env.timings["cluster_ready_s"] = time.monotonic() - t0
    print(f"\n[k8s fixture] kube-apiserver ready in {env.timings['apiserver_ready_s']:.1f}s, "
          f"cluster usable in {env.timings['cluster_ready_s']:.1f}s")
    return env


def _stop_cluster() -> None:
    global _cluster
    env, _cluster = _cluster, None
    if env is not None:
        env.kubelet.stop()
        env.plane.stop()


@pytest.fixture
def k8s(tmp_path_factory) -> K8s:
    """The cluster, started by the first test that asks for it and shared by the tests that follow.

    It stops after the last Kubernetes test of a run of them (see ``pytest_runtest_teardown``), not
    at the end of the session: an idle control plane costs ~3 % of a core, and a pytest-xdist worker
    goes on with other files for minutes. ``tests/conftest.py`` keeps the Kubernetes files together
    (in order, and on one xdist worker), so a run starts one cluster.
    """
    global _cluster
    if _cluster is None:
        _cluster = _start_cluster(tmp_path_factory)
    return _cluster


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: Any, nextitem: Any) -> None:
    """Called for the tests of this directory only: stop the cluster when the next test is not one."""
    if nextitem is None or HERE not in Path(str(nextitem.path)).resolve().parents:
        _stop_cluster()


def pytest_sessionfinish(session: Any) -> None:
    _stop_cluster()


def _bind_limited_role(api: Any) -> None:
    """The 'limited' user may manage Secrets and read pods, but not create them (for the RBAC test)."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(NAMESPACE, {
        "metadata": {"name": "pods-read-only"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list", "watch"]},
                  {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "get", "update", "delete",
                                                                         "list", "deletecollection"]}]})
    rbac.create_namespaced_role_binding(NAMESPACE, {
        "metadata": {"name": "pods-read-only"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods-read-only"},
        "subjects": [{"kind": "User", "name": LIMITED_USER, "apiGroup": "rbac.authorization.k8s.io"}]})
