"""docs/kubernetes.md's manifests are what an operator would apply: the API server accepts them
(server-side dry run) and its Role is the one the launcher asks for."""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from rlmesh.launch.kubernetes.manifests import role_manifests

pytestmark = pytest.mark.timeout(60)
DOC = Path(__file__).resolve().parents[3] / "docs/kubernetes.md"


def doc_objects() -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)^ *```", DOC.read_text(), flags=re.S | re.M)
    return [d for b in blocks for d in yaml.safe_load_all(textwrap.dedent(b)) if d]


def test_docs_role_is_the_launchers_role():
    docs_role = [d for d in doc_objects() if d["kind"] == "Role"][0]
    assert docs_role["rules"] == [d for d in role_manifests("rl") if d["kind"] == "Role"][0]["rules"]


def test_docs_manifests_pass_a_server_side_dry_run(k8s):
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(k8s.api)
    create = {"Pod": k8s.core.create_namespaced_pod, "ServiceAccount": k8s.core.create_namespaced_service_account,
              "Service": k8s.core.create_namespaced_service, "Endpoints": k8s.core.create_namespaced_endpoints,
              "Role": rbac.create_namespaced_role, "RoleBinding": rbac.create_namespaced_role_binding}
    objs = doc_objects()
    assert {"Pod", "ServiceAccount", "Role", "RoleBinding", "Service", "Endpoints"} <= {o["kind"] for o in objs}
    for obj in objs:
        obj["metadata"]["namespace"] = k8s.namespace
        for s in obj.get("subjects") or []:
            s["namespace"] = k8s.namespace
    # The ServiceAccount is created for real: the pod's admission needs it (and, on 1.20, its token).
    sa = [o for o in objs if o["kind"] == "ServiceAccount"][0]
    k8s.core.create_namespaced_service_account(k8s.namespace, sa)
    try:
        deadline = time.monotonic() + 30
        while not k8s.core.read_namespaced_service_account(sa["metadata"]["name"], k8s.namespace).secrets:
            assert time.monotonic() < deadline, "the token controller did not give the ServiceAccount a token"
            time.sleep(0.1)
        for obj in objs:
            if obj is not sa:
                create[obj["kind"]](k8s.namespace, obj, dry_run="All")
    finally:
        k8s.core.delete_namespaced_service_account(sa["metadata"]["name"], k8s.namespace)
