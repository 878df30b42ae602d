"""Where a recipe's procs come from: the ``launcher`` config group turned into something
with ``spawn_procs`` (``rm.this_host()`` or a Kubernetes namespace), so the same recipe
runs locally or on a cluster with ``launcher=kubernetes``."""

from __future__ import annotations

from typing import Any

import rlmesh as rm
from rlmesh.launch.kubernetes import KubernetesCluster


def place(launcher: str, settings: dict[str, Any] | None = None) -> Any:
    """``launcher='local'``: this host. ``'kubernetes'``: a ``KubernetesCluster`` built from
    ``settings`` (the ``launcher`` group, fields of ``KubernetesConfig``)."""
    if launcher == "local":
        return rm.this_host()
    if launcher == "kubernetes":
        return KubernetesCluster(dict(settings or {}))
    raise rm.ConfigError(f"launcher={launcher!r} is not a launcher; use launcher=local or launcher=kubernetes")
