"""``RemoteCluster``: what a place to spawn procs off this host (``KubernetesCluster``, ``SlurmCluster``) shares.

Such a cluster owns one launcher for its procs. It closes once, on :meth:`RemoteCluster.close`, at the end of a
``with`` block or at interpreter exit, whichever comes first: it stops the procs that launcher started, then closes
the launcher (which removes what it created: pods and their Secret, job steps and a job it asked for).
"""

from __future__ import annotations

import atexit
import math
from typing import Any, Generic, Protocol, Self, TypeVar

from rlmesh.actor.controller import Controller, LaunchRequest, Restart
from rlmesh.actor.proc_mesh import ProcMesh
from rlmesh.actor.proc_state import ENDED
from rlmesh.actor.procs import ProcHandle

__all__ = ["ClusterLauncher", "RemoteCluster"]


class ClusterLauncher(Protocol):
    """The launcher a :class:`RemoteCluster` owns: it launches procs and closes once."""

    closed: bool

    def launch(self, req: LaunchRequest) -> ProcHandle: ...

    def close(self) -> None:
        """Remove what the launcher created; a second call does nothing."""


L = TypeVar("L", bound=ClusterLauncher)


class RemoteCluster(Generic[L]):
    """Base of the clusters that launch procs elsewhere, over their launcher type ``L``. A subclass sets
    ``self.launcher`` and, once it is ready, calls :meth:`_close_at_exit`; it spawns through :meth:`_launch`."""

    launcher: L

    def _close_at_exit(self) -> None:
        """Run :meth:`close` at interpreter exit, unless it has run before."""
        atexit.register(self.close)

    def _running_meshes(self) -> list[str]:
        """The proc mesh of each proc this cluster's launcher runs now (restarting ones included): what
        admission counts beside a new mesh. Empty before the controller starts."""
        controller = Controller.current()
        if controller is None:
            return []
        return [r.proc_mesh for r in list(controller.procs.values())
                if r.launcher is self.launcher and r.state not in ENDED]

    def _launch(self, name: str, dims: dict[str, int], restart: Restart | None, env: dict[str, str] | None,
                timeout: float | None) -> ProcMesh:
        """``ProcMesh.launch`` through this cluster's launcher; a spawn that fails stops the procs it started."""
        controller = Controller.get()
        try:
            return ProcMesh.launch(name, dims, self.launcher, restart, env, timeout)
        except BaseException:
            ids = [f"{name}.{i}" for i in range(math.prod(dims.values()))]
            controller.stop_procs([i for i in ids if i in controller.procs], timeout=1)
            raise

    def close(self) -> None:
        """Stop this cluster's procs, then close its launcher. Also runs at interpreter exit; a second call
        does nothing."""
        if self.launcher.closed:
            return
        controller = Controller.current()
        if controller is not None and not controller.closed:
            ours = [p for p, r in controller.procs.items() if r.launcher is self.launcher]
            if ours:
                controller.stop_procs(ours, timeout=3)
        self.launcher.close()
        atexit.unregister(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
