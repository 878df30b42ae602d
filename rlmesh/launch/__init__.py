"""Where procs come from: ``local`` (child processes of the controller) and ``kubernetes`` (pods).

``rlmesh.launch.kubernetes`` is imported on first use, so the kubernetes client is
only loaded by programs that launch pods.
"""

from __future__ import annotations

import importlib
from typing import Any

from rlmesh.launch.local import HostMesh, LocalLauncher, this_host

__all__ = ["HostMesh", "LocalLauncher", "kubernetes", "this_host"]


def __getattr__(name: str) -> Any:
    if name == "kubernetes":
        return importlib.import_module("rlmesh.launch.kubernetes")
    raise AttributeError(f"module 'rlmesh.launch' has no attribute {name!r}")
