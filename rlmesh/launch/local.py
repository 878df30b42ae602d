"""The local launcher: worker procs are child processes of the controller, on this host.

Workers get the controller's ``sys.path`` (so classes from the user's modules and
test files import the same way), its working directory and environment, plus the
job secret and plugin variables from the controller. They die with the
controller: ``PR_SET_PDEATHSIG`` on Linux, and a controller-silence timeout
everywhere.

Relaunches of procs whose mesh may restart are forked from a warm template
(:mod:`rlmesh.launch.forkserver`) instead of starting Python again, unless
``RLMESH_FORKSERVER=0`` or ``LocalLauncher(fork_server=False)``.

``LocalLauncher(netns=hosts)`` (``rm.this_host(netns=hosts)``) starts the procs on simulated hosts
instead (:mod:`rlmesh.launch.netns`): each in a network namespace of its own, bound to its host's
address, so they reach the controller and each other over a bridge, as procs on other machines do.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Iterable, Sequence

from rlmesh import settings
from rlmesh.actor.controller import Controller, LaunchRequest, Restart
from rlmesh.actor.hooks import WORKER_PLUGINS_ENV
from rlmesh.actor.proc_mesh import ProcMesh
from rlmesh.actor.proc_state import ENDED
from rlmesh.launch import capture, forkserver, starters
from rlmesh.launch.admission import admit_spawn
from rlmesh.launch.forkserver import ForkedProcHandle, ForkServer
from rlmesh.launch.netns import NetnsHost
from rlmesh.transport.auth import is_loopback_address

logger = logging.getLogger(__name__)


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

    @property
    def local_pid(self) -> int | None:
        """For the supervisor's ``/proc/<pid>/stat`` check (a stopped proc is a hang, a running one may be slow)."""
        return self.pid


class NetnsProcHandle(LocalProcHandle):
    """A proc on a simulated host (:class:`~rlmesh.launch.netns.NetnsHost`), seen as a proc on another
    machine is: no ``local_pid`` (the supervisor judges it by its heartbeats alone), and a kill that
    travels to its host, so it is lost while the host's link is down. Why: a partitioned host's procs
    live on, out of reach; that is what the controller's fencing of a stale incarnation is for, and
    a kill that always arrived would hide it. :meth:`force_kill` (the launcher's close) ends it anyway.
    """

    def __init__(self, popen: subprocess.Popen, host: NetnsHost):
        super().__init__(popen)
        self.host = host
        self.kill_lost = False

    @property
    def local_pid(self) -> int | None:
        return None

    def kill(self) -> None:
        if self.host.reachable():
            super().kill()
        elif not self.kill_lost:
            self.kill_lost = True
            logger.warning("kill of pid %s lost: host %s (%s) is cut off; it is fenced if it comes back",
                           self.pid, self.host.hostname, self.host.address)

    def force_kill(self) -> None:
        super().kill()


class LocalLauncher:
    """Starts ``python -m rlmesh.worker`` children. ``python`` defaults to this interpreter.

    ``fork_server``: fork relaunched procs of restartable meshes from a warm
    template (default: on unless ``RLMESH_FORKSERVER=0``). ``fork_preload``: the
    modules the template imports up front (those of the mesh's actor classes
    follow once actors are spawned).

    ``netns``: simulated hosts (:class:`~rlmesh.launch.netns.HostNetwork`'s ``hosts``) to start the
    procs on, rank ``i`` on host ``i % len(netns)``; a replacement starts on its proc's host, or,
    while that host is cut off, on the next host that is reachable. Each proc binds its host's
    address, so everything it serves is CurveZMQ; the controller must listen on the bridge
    (``RLMESH_BIND_HOST`` set to ``HostNetwork.address`` before the first ``spawn_procs``). Such a
    proc is treated as one on another machine: it heartbeats by message (no shared-memory board),
    is started afresh (no warm template: those live in this namespace), and exits by itself after
    ``RLMESH_CONTROLLER_TIMEOUT_S`` of silence from its controller.
    """

    same_host = True
    """Its procs run on the controller's host: they heartbeat through its shared-memory board."""

    def __init__(self, python: str | None = None, extra_env: dict[str, str] | None = None,
                 fork_server: bool | None = None, fork_preload: Iterable[str] = forkserver.DEFAULT_PRELOAD,
                 netns: Sequence[NetnsHost] | None = None):
        self.python = python or sys.executable
        self.extra_env = extra_env or {}
        self.netns = tuple(netns or ())
        if self.netns:
            self.same_host = False
            fork_server = False
        self._netns_handles: list[NetnsProcHandle] = []
        self.fork_server = fork_server
        self.fork_preload = tuple(fork_preload)
        self._servers: dict[str, ForkServer] = {}  # proc mesh -> its restart template (actor modules, torch)
        self._lock = threading.Lock()
        self._capture: capture.OutputCapture | None = None

    def _fork_enabled(self) -> bool:
        return forkserver.enabled_by_env() if self.fork_server is None else self.fork_server

    def _env(self, req: LaunchRequest) -> dict[str, str]:
        return starters.worker_env({**self.extra_env, **req.env})

    def launch(self, req: LaunchRequest) -> LocalProcHandle | ForkedProcHandle:
        if self.netns:
            return self._launch_netns(req)
        env = self._env(req)
        argv = ["--controller", req.controller_addr, "--proc-id", req.proc_id, "--proc-mesh", req.proc_mesh,
                "--rank", str(req.rank), "--incarnation", str(req.incarnation)]
        cmd = [self.python, "-m", "rlmesh.worker", *argv, "--parent-pid", str(os.getpid())]
        if self._fork_enabled():
            handle = None
            prep = self._prepare_capture(req, fork=True)
            child_env = prep.env if prep else None
            # a forked worker redirects its own stdio into the FIFOs (child_env says so), and so
            # does this fresh one, should the template die before it forks the request
            fallback = lambda: LocalProcHandle(subprocess.Popen(cmd, env={**env, **(child_env or {})},  # noqa: E731
                                                                stdin=subprocess.DEVNULL))
            if getattr(req, "restartable", False):
                handle = self._via_fork_server(req, env, argv, child_env, fallback)
            if handle is None:
                handle = self._via_starter(env, argv, child_env, fallback)
            if handle is not None:
                return capture.captured(handle, prep)
            if prep is not None:
                prep.abort()
        prep = self._prepare_capture(req, fork=False)
        if prep is None:
            return LocalProcHandle(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL))
        try:
            popen = subprocess.Popen(cmd, env={**env, **prep.env}, stdin=subprocess.DEVNULL,
                                     stdout=prep.stdout_fd, stderr=prep.stderr_fd)
        except BaseException:
            prep.abort()
            raise
        return capture.captured(LocalProcHandle(popen), prep)

    def _place(self, req: LaunchRequest) -> NetnsHost:
        """The proc's host (rank modulo the hosts), or the next one reachable while it is cut off."""
        n = len(self.netns)
        order = [self.netns[(req.rank + i) % n] for i in range(n)]
        return next((h for h in order if h.reachable()), order[0])

    def _launch_netns(self, req: LaunchRequest) -> NetnsProcHandle:
        if is_loopback_address(req.controller_addr):
            raise ValueError(f"procs on network-namespace hosts dial the controller over their bridge, but it listens "
                             f"on {req.controller_addr.partition('#')[0]} (loopback): set {settings.BIND_HOST.name} to "
                             f"the bridge's address (HostNetwork.address) before the first spawn_procs")
        host = self._place(req)
        env = {**self._env(req), settings.BIND_HOST.name: host.address}
        env.pop(settings.ADVERTISE_HOST.name, None)
        # no --parent-pid: like a proc on another machine, it outlives its controller's silence for
        # RLMESH_CONTROLLER_TIMEOUT_S at most, rather than dying with a parent on this one
        cmd = [*host.prefix(), self.python, "-m", "rlmesh.worker", "--controller", req.controller_addr,
               "--proc-id", req.proc_id, "--proc-mesh", req.proc_mesh, "--rank", str(req.rank),
               "--incarnation", str(req.incarnation)]
        prep = self._prepare_capture(req, fork=False)
        try:
            popen = subprocess.Popen(cmd, env={**env, **(prep.env if prep else {})}, stdin=subprocess.DEVNULL,
                                     stdout=prep.stdout_fd if prep else None, stderr=prep.stderr_fd if prep else None)
        except BaseException:
            if prep is not None:
                prep.abort()
            raise
        handle = NetnsProcHandle(popen, host)
        with self._lock:
            self._netns_handles = [h for h in self._netns_handles if h.poll() is None] + [handle]
        return capture.captured(handle, prep)

    def _via_starter(self, env: dict[str, str], argv: list[str], child_env: dict[str, str] | None,
                     fallback: Callable[[], LocalProcHandle] | None = None) -> ForkedProcHandle | None:
        """Fork a proc from the launcher's shared start-up template (one per environment, started on first use).

        The request is queued on the template's pipe at once, even before the template finished
        importing: the supervisor thread never waits, and the template forks every queued proc
        the moment it is ready. None (start Python afresh) when the template is gone.
        """
        srv = self._starter(env)
        if srv is None:
            return None
        plugins = [m.split(":", 1)[0].strip() for m in env.get(WORKER_PLUGINS_ENV, "").split(",") if m.strip()]
        want = [*plugins, *starters.controller_heavy()]
        try:
            if any(m not in srv.preloaded for m in want):  # imported before the forks queued after this
                srv.preload([m for m in want if m not in srv.preloaded], now=True)
            return srv.fork(argv + ["--parent-pid", str(os.getpid())], {**env, **(child_env or {})}, os.getcwd(),
                            wait_s=0.0, fallback=fallback)
        except OSError:
            srv.dead = True
            return None

    def _starter(self, env: dict[str, str], heavy: tuple[str, ...] = ()) -> ForkServer | None:
        """The start-up template for ``env`` (shared by every launcher of this controller)."""
        return starters.starter(self.python, env, heavy, on_exit=Controller.notice_exit_if_open)

    def prestart(self, env: dict[str, str] | None = None, heavy: tuple[str, ...] = (), output: bool = True) -> None:
        """Start the start-up template now (on the supervisor thread: it must outlive the call), so its
        imports overlap the controller's own start (the telemetry service) instead of following it.
        ``heavy``: modules it imports before its first fork even though this controller has not yet
        (a recipe's torch, while the controller is still importing it too). ``output``: start the
        output capture's threads too (each thread's start waits for the GIL: ~10 ms apiece while the
        controller imports, which the first launch would otherwise wait out)."""
        if self._fork_enabled():
            self._starter(self._env(LaunchRequest("", "", "", 0, 0, env or {})), heavy)
        if output:
            self._output_capture()

    def _output_capture(self) -> capture.OutputCapture | None:
        """The launcher's output capture (one reader thread for all its procs), unless RLMESH_CAPTURE=0."""
        if not capture.capture_enabled():
            return None
        with self._lock:
            if self._capture is None:
                self._capture = capture.OutputCapture()
            return self._capture

    def _prepare_capture(self, req: LaunchRequest, fork: bool) -> capture.Prepared | None:
        """FIFOs for this launch's output (the ``logs``/``stacks`` tables, the terminal echo), unless RLMESH_CAPTURE=0."""
        cap = self._output_capture()
        return None if cap is None else cap.prepare(req.proc_id, req.proc_mesh, req.rank, req.incarnation, fork)

    def _via_fork_server(self, req: LaunchRequest, env: dict[str, str], argv: list[str],
                         child_env: dict[str, str] | None = None,
                         fallback: Callable[[], LocalProcHandle] | None = None) -> ForkedProcHandle | None:
        """First launch: start the mesh's template (in the background) and return None; relaunch: fork it.

        The template is forked from the start-up template of the same environment where one runs
        (it has the worker runtime and torch imported already), else started as a fresh Python."""
        with self._lock:
            srv = self._servers.get(req.proc_mesh)
            # it served, then died (killed): its procs run on, and a new one takes its place, forked from the
            # start-up template; while that is gone too (its new one is starting), this relaunch uses that
            # and a later one replaces this template, rather than import torch twice side by side
            parent = starters.running(self.python, env)
            replace = srv is not None and srv.dead and srv.ready.is_set() and req.incarnation > 0 and parent is not None
            if replace:
                logger.warning("fork server of %s died; starting a new one (its procs run on)", req.proc_mesh)
            if (srv is None and req.incarnation == 0) or replace:
                try:
                    self._servers[req.proc_mesh] = ForkServer(
                        self.python, env, os.getcwd(), self.fork_preload, name=req.proc_mesh,
                        on_exit=Controller.notice_exit_if_open, parent=parent)
                except Exception:  # noqa: BLE001 - procs still start the plain way
                    logger.warning("could not start a fork server for %s; its restarts start Python afresh",
                                   req.proc_mesh, exc_info=True)
                return None
        if srv is None or req.incarnation == 0:
            return None
        if srv.usable:
            try:
                return srv.fork(argv + ["--parent-pid", str(os.getpid())], {**env, **(child_env or {})}, os.getcwd(),
                                fallback=fallback)
            except OSError:
                srv.dead = True
        if not srv.warned:
            srv.warned = True
            logger.warning("fork server of %s is %s: restarting %s from the start-up template (or a fresh Python)",
                           req.proc_mesh,
                           "gone" if srv.dead else "not ready yet", req.proc_id)
        return None

    def preload(self, proc_mesh: str, modules: list[str]) -> None:
        """Have ``proc_mesh``'s template import ``modules`` (the actor classes' modules), so restarts skip it."""
        srv = self._servers.get(proc_mesh)
        if srv is not None:
            srv.preload(modules)

    def wait_fork_server(self, proc_mesh: str, timeout: float = 30.0) -> bool:
        """Block until ``proc_mesh``'s template is ready to fork (False: none, dead, or not in time)."""
        srv = self._servers.get(proc_mesh)
        return srv is not None and srv.ready.wait(timeout) and not srv.dead

    def fork_server_pid(self, proc_mesh: str) -> int | None:
        """The pid of ``proc_mesh``'s fork server (its restart template), ``None`` while it has none."""
        srv = self._servers.get(proc_mesh)
        return None if srv is None else srv.pid

    def release(self, proc_mesh: str) -> None:
        """The mesh stopped: stop its template (and anything it forked that is still running)."""
        with self._lock:
            srv = self._servers.pop(proc_mesh, None)
        if srv is not None:
            srv.close()

    def close(self) -> None:
        """Stop every template (the controller shuts down)."""
        for name in list(self._servers):
            self.release(name)
        with self._lock:
            cut_off, self._netns_handles = self._netns_handles, []
        for h in cut_off:  # procs whose kill was lost on a cut link: this machine's kill still reaches them
            if h.poll() is None:
                h.force_kill()
                h.popen.wait()
        starters.close_all()
        with self._lock:
            cap, self._capture = self._capture, None
        if cap is not None:
            cap.close()


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
        Refused (:class:`~rlmesh.errors.ConfigError`, one line) before any proc starts when this host
        cannot hold that many procs now (:mod:`rlmesh.launch.admission`, ``RLMESH_MAX_PROCS``).
        """
        dims = dict(per_host or {"procs": 1})
        if not dims:
            raise ValueError("per_host needs at least one dimension, e.g. per_host={'procs': 4}")
        ctl = Controller.current()
        running = 0 if ctl is None else sum(1 for r in list(ctl.procs.values())
                                            if isinstance(r.launcher, LocalLauncher) and r.state not in ENDED)
        admit_spawn(dims, running)  # before the controller starts, or the template forks
        n = next(self._names)
        if hasattr(self.launcher, "prestart"):  # overlap the template's imports with the controller's start
            Controller.get().submit(lambda: self.launcher.prestart(env))
        return ProcMesh.launch(name or ("procs" if n == 0 else f"procs{n}"), dims, self.launcher, restart, env,  # type: ignore[arg-type]  # LocalLauncher has Launcher's methods; it does not subclass it
                               timeout)


def prewarm(heavy: tuple[str, ...] = starters.TORCH_HEAVY) -> None:
    """Start this host's start-up template now, importing ``heavy``, for procs a later
    ``this_host().spawn_procs`` will fork from it.

    Why: the template imports what its procs will (torch: ~2.5 s of CPU), and it used to start at
    ``spawn_procs``, after the controller had imported the same modules itself, so a recipe paid
    both imports one after the other. Called before a recipe resolves its actor classes, the two
    run side by side. When: only where procs will be forked on this host (the local launcher); a
    template whose environment no longer matches at ``spawn_procs`` is left unused (and stopped
    with the others at shutdown).
    """
    launcher = LocalLauncher()
    Controller.get().submit(lambda: launcher.prestart(None, heavy, output=False))


def this_host(**launcher_opts: Any) -> HostMesh:
    """The host the controller runs on: ``rm.this_host().spawn_procs(per_host={"procs": 4})``.
    ``launcher_opts`` go to :class:`LocalLauncher` (``netns=hosts``: procs on simulated hosts)."""
    return HostMesh(LocalLauncher(**launcher_opts) if launcher_opts else None)
