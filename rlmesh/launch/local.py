"""The local launcher: worker procs are child processes of the controller, on this host.

Workers get the controller's ``sys.path`` (so classes from the user's modules and
test files import the same way), its working directory and environment, plus the
job secret and plugin variables from the controller. They die with the
controller: ``PR_SET_PDEATHSIG`` on Linux, and a controller-silence timeout
everywhere.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from typing import Any

from rlmesh.actor.controller import LaunchRequest, Restart
from rlmesh.actor.proc_mesh import ProcMesh


class LocalProcHandle:
    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid: int | None = popen.pid

    def poll(self) -> tuple[int | None, int | None] | None:
        rc = self.popen.poll()
        if rc is None:
            return None
        return (None, -rc) if rc < 0 else (rc, None)

    def kill(self) -> None:
        try:
            self.popen.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass


class LocalLauncher:
    """Starts ``python -m rlmesh.worker`` children. ``python`` defaults to this interpreter."""

    def __init__(self, python: str | None = None, extra_env: dict[str, str] | None = None):
        self.python = python or sys.executable
        self.extra_env = extra_env or {}

    def launch(self, req: LaunchRequest) -> LocalProcHandle:
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update(req.env)
        paths = [p or os.getcwd() for p in sys.path]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        cmd = [self.python, "-m", "rlmesh.worker", "--controller", req.controller_addr, "--proc-id", req.proc_id,
               "--proc-mesh", req.proc_mesh, "--rank", str(req.rank), "--incarnation", str(req.incarnation),
               "--parent-pid", str(os.getpid())]
        return LocalProcHandle(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL))


class HostMesh:
    """This host, as a place to spawn procs on."""

    _names = itertools.count()

    def __init__(self, launcher: LocalLauncher | None = None):
        self.launcher = launcher or LocalLauncher()

    def spawn_procs(self, per_host: dict[str, int] | None = None, *, restart: Restart | None = None,
                    name: str | None = None, env: dict[str, str] | None = None,
                    timeout: float | None = None) -> ProcMesh:
        """Start worker procs on this host laid out as ``per_host`` (default ``{"procs": 1}``).

        ``restart``: what to do when one dies (``rm.Restart(max_restarts=3)``; default never).
        ``env``: extra environment variables for the workers.
        """
        dims = dict(per_host or {"procs": 1})
        if not dims:
            raise ValueError("per_host needs at least one dimension, e.g. per_host={'procs': 4}")
        n = next(self._names)
        return ProcMesh.launch(name or ("procs" if n == 0 else f"procs{n}"), dims, self.launcher, restart, env,
                               timeout)


def this_host(**launcher_opts: Any) -> HostMesh:
    """The host the controller runs on: ``rm.this_host().spawn_procs(per_host={"procs": 4})``."""
    return HostMesh(LocalLauncher(**launcher_opts) if launcher_opts else None)
