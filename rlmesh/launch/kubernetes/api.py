"""Credentials and errors for the Kubernetes launcher: find an API server, explain refusals.

Why a module of its own: every way talking to a cluster goes wrong (no credentials,
RBAC, an unknown namespace, an invalid manifest, an unreachable server) should end in
one :class:`KubernetesError` whose message says what happened and the fix, and the
launcher, the CLI and the tests all share that wording. The ``kubernetes`` package is
imported only here and in the launcher, never by ``import rlmesh``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from rlmesh.errors import RlmeshError
from rlmesh.launch.kubernetes.manifests import role_manifests, to_yaml

logger = logging.getLogger(__name__)

IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class KubernetesError(RlmeshError):
    """The Kubernetes API refused or failed a request; the message says why and the fix."""


class KubernetesCredentialsError(KubernetesError):
    """No kubeconfig and no in-cluster service account: nowhere to send requests."""


class KubernetesForbidden(KubernetesError):
    """RBAC refused a request; the message carries the Role the launcher needs."""


MISSING_CLIENT = "the Kubernetes launcher needs the kubernetes client: pip install 'rlmesh[kubernetes]'"


def kubernetes_client() -> Any:
    """The ``kubernetes`` package (an extra), or a :class:`KubernetesError` naming the extra to install."""
    try:
        import kubernetes  # deferred: optional extra rlmesh[kubernetes], loaded only to talk to a cluster
    except ImportError as exc:
        raise KubernetesError(MISSING_CLIENT) from exc
    return kubernetes


def load_api_client(kubeconfig: str = "", context: str = "") -> Any:
    """An ``ApiClient`` from ``kubeconfig`` (or ``$KUBECONFIG``, ``~/.kube/config``), else in-cluster.

    Raises :class:`KubernetesCredentialsError` naming every place it looked.
    """
    k8s = kubernetes_client()
    ConfigException = k8s.config.config_exception.ConfigException

    tried: list[str] = []
    paths = [kubeconfig] if kubeconfig else [
        *(p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p),
        os.path.expanduser("~/.kube/config")]
    for path in paths:
        if not os.path.exists(path):
            tried.append(f"kubeconfig {path} (missing)")
            continue
        try:
            return k8s.config.new_client_from_config(config_file=path, context=context or None)
        except (ConfigException, ValueError, KeyError) as exc:
            if kubeconfig:
                raise KubernetesCredentialsError(f"kubeconfig {path} is unusable: {exc}") from exc
            tried.append(f"kubeconfig {path} ({exc})")
    if not kubeconfig:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = k8s.client.Configuration()
            try:
                k8s.config.load_incluster_config(client_configuration=cfg)
                return k8s.client.ApiClient(cfg)
            except ConfigException as exc:
                tried.append(f"in-cluster service account ({exc})")
        else:
            tried.append("in-cluster service account (not in a pod: KUBERNETES_SERVICE_HOST is unset)")
    raise KubernetesCredentialsError(
        "no Kubernetes credentials found; tried " + "; ".join(tried) + ". Fix: point launcher.kubeconfig "
        "(--kubeconfig for `rlmesh k8s`, or $KUBECONFIG) at a kubeconfig file, or run the controller in a pod whose ServiceAccount is "
        "bound to the Role that `rlmesh k8s role` prints.")


def _server_message(exc: Any) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return str(getattr(exc, "body", "") or exc.reason)
    msg = body.get("message") or exc.reason or ""
    causes = (body.get("details") or {}).get("causes") or []
    if causes:
        msg += " [" + "; ".join(f"{c.get('field', '')}: {c.get('message', '')}" for c in causes) + "]"
    return msg


def role_help(namespace: str) -> str:
    """The RBAC objects as YAML, ready for ``kubectl apply -f -``."""
    return to_yaml(role_manifests(namespace))


def explain(exc: BaseException, action: str, namespace: str) -> KubernetesError:
    """Turn a client exception from ``action`` into a :class:`KubernetesError` that says the fix."""
    k8s = kubernetes_client()
    if isinstance(exc, k8s.client.exceptions.ApiException):
        msg = _server_message(exc)
        if exc.status == 403:
            return KubernetesForbidden(
                f"{action} in namespace {namespace!r} was forbidden by the API server: {msg}\n"
                f"The identity the controller runs as needs this Role (bind it to your user or the controller's "
                f"ServiceAccount; `rlmesh k8s role --namespace {namespace}` prints it again):\n\n"
                f"{role_help(namespace)}")
        if exc.status == 401:
            return KubernetesCredentialsError(
                f"{action}: the API server rejected the credentials (401 {msg}); refresh the kubeconfig's "
                f"token or certificate")
        if exc.status == 404 and "namespaces" in msg:
            return KubernetesError(f"{action}: namespace {namespace!r} does not exist ({msg}); create it "
                                   f"(kubectl create namespace {namespace}) or set launcher.namespace")
        if exc.status == 409:
            return KubernetesError(f"{action}: {msg}. A leftover of an earlier run with the same "
                                   f"launcher.run? Remove it with `rlmesh k8s cleanup RUN`, or pick another run name")
        if exc.status == 422:
            return KubernetesError(f"{action}: the API server found the manifest invalid: {msg}; fix the "
                                   f"launcher settings (or launcher.pod_template) named there")
        return KubernetesError(f"{action} failed: HTTP {exc.status} {msg}")
    return KubernetesError(f"{action} failed: cannot reach the API server ({type(exc).__name__}: {exc}); "
                           f"check the kubeconfig's server address and that the cluster is up")
