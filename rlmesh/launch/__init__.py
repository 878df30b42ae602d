"""Where procs come from: ``local`` (child processes of the controller) and ``kubernetes`` (pods).

Names load on first use: ``rlmesh.launch.kubernetes`` (the kubernetes client) only in programs
that launch pods, ``rlmesh.launch.local`` (the controller side) only where procs are launched,
so a worker that needs only :mod:`rlmesh.launch.output` does not load the launchers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["HostMesh", "LocalLauncher", "kubernetes", "this_host"]

_LOCAL = {"HostMesh", "LocalLauncher", "this_host"}


def __getattr__(name: str) -> Any:
    if name == "kubernetes":
        return importlib.import_module("rlmesh.launch.kubernetes")
    if name in _LOCAL:
        value = getattr(importlib.import_module("rlmesh.launch.local"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlmesh.launch' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from rlmesh.launch.local import HostMesh, LocalLauncher, this_host
