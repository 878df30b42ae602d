"""Where procs come from: ``local`` (child processes of the controller), ``kubernetes`` (pods) and
``slurm`` (job steps).

``this_host()`` is the front door for local procs: it starts their start-up template before it
imports the launcher. Names load on first use: ``rlmesh.launch.kubernetes`` (the kubernetes
client) only in programs that launch pods, ``rlmesh.launch.slurm`` only in programs that start
job steps, ``rlmesh.launch.local`` (the controller side) only where procs are launched, so a
worker that needs only :mod:`rlmesh.launch.output` does not load the launchers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["HostMesh", "LocalLauncher", "kubernetes", "slurm", "this_host"]

_LOCAL = {"HostMesh", "LocalLauncher"}


def this_host(**launcher_opts: Any) -> "HostMesh":
    """The host the controller runs on: ``rm.this_host().spawn_procs(per_host={"procs": 4})``.

    It starts this controller's start-up template first (:func:`rlmesh.launch.starters.start_early`),
    then imports the local launcher and the controller's runtime while the template imports the
    worker's: the two imports run side by side instead of one after the other (``spawn_procs(4)`` +
    first call 0.22 -> 0.16 s on 2 cores, docs/performance.md). ``launcher_opts`` (another
    interpreter, extra environment, no templates) start no early template.
    """
    if not launcher_opts:
        importlib.import_module("rlmesh.launch.starters").start_early()
    return importlib.import_module("rlmesh.launch.local").this_host(**launcher_opts)


def __getattr__(name: str) -> Any:
    if name in ("kubernetes", "slurm"):
        return importlib.import_module(f"rlmesh.launch.{name}")
    if name in _LOCAL:
        value = getattr(importlib.import_module("rlmesh.launch.local"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlmesh.launch' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from rlmesh.launch.local import HostMesh, LocalLauncher
