"""Where procs come from: ``local`` (child processes of the controller) and, later, ``kubernetes`` (pods)."""

from rlmesh.launch.local import HostMesh, LocalLauncher, this_host

__all__ = ["HostMesh", "LocalLauncher", "this_host"]
