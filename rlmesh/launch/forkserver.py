"""A warm template for restarting local worker procs: fork a pre-imported process instead of starting Python.

Why: a replacement proc started with ``python -m rlmesh.worker`` spends about a
second starting the interpreter and importing torch / gymnasium before it can
serve. The fork server is a process started once per restartable proc mesh,
with the same interpreter, environment and working directory a worker of that
mesh would get. It imports :mod:`rlmesh.worker`, numpy and torch (and later the
modules the mesh's actor classes live in) and then waits. A relaunch asks it to
``fork()``; the child sets its environment, working directory and ``sys.path``
exactly as a fresh worker would have them and runs the worker's ``main``.

When: with the local launcher, unless ``RLMESH_FORKSERVER=0``. Two kinds: a mesh's restart
template (procs of meshes whose ``Restart`` policy allows restarts, for relaunches) and the
start-up template shared by first launches (:mod:`rlmesh.launch.starters`).

This module is the controller's side, and imports nothing of the worker runtime: the template
process runs :mod:`rlmesh.launch.fork_template`.

Rules the server keeps so that ``fork()`` is safe: it starts no rlmesh runtime
(no sockets, no threads of its own), and it dies with the controller
(``PR_SET_PDEATHSIG`` plus exit when its request pipe closes). Its children die with the
controller, not with it: each holds a pidfd of the controller and exits when that becomes
readable (:func:`rlmesh.actor.worker._die_with_parent`), so a template that dies (a SIGKILL, the
OOM killer) costs nothing that is already running. Children are not the controller's children,
so the server reaps them and reports ``pid -> (exit_code, signal)`` on a status pipe;
:class:`ForkServer` (the controller's side) reads it on a thread, and :class:`ForkedProcHandle`
answers ``poll()`` from that table without blocking; once the server is dead, from whether the
pid still exists. The next launch that needs a dead template starts a new one.

A mesh's restart template is forked from the start-up template of the same environment where one
runs (``ForkServer(parent=...)``): it then has the worker runtime, and torch where the controller
imported it, loaded already, and costs a fork instead of a Python start (~1.4 s of CPU and ~230 MB
per restartable mesh on 2 cores). It connects back to a Unix socket in a fresh 0700 folder, which
carries the same messages as the two pipes, and it dies with the start-up template.

Protocol (one JSON object per line): requests ``{"op": "fork", "id", "argv",
"env", "cwd"}``, ``{"op": "template", "id", "addr", "env", "cwd", "preload"}`` (fork a restart
template that connects to ``addr``) and ``{"op": "preload", "modules", "now"}`` (``now``: import
before serving the next request, else between requests); replies ``{"ready": true, "pid"}``,
``{"id", "pid"}`` or ``{"id", "error"}``, and ``{"exit": pid, "code", "signal"}``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable, Iterable

from rlmesh import settings
from rlmesh.actor.pids import pid_running

logger = logging.getLogger(__name__)

FORKSERVER_ENV = settings.FORKSERVER.name
DEFAULT_PRELOAD = ("numpy", "torch")
FRESH_IMPORTS_ENV = settings.FRESH_IMPORTS.name
"""Folders (os.pathsep-separated) whose modules a forked child must import afresh, not inherit
from the template: a synced workspace (rlmesh.workspace sets it on the procs it activated)."""
# The start-up template (first launches) imports only what every worker imports anyway: the
# worker itself and the worker plugins named in its environment. Not torch: its ~3 s import
# would hold back every first launch, and many procs (buffers, reward) never use it.
STARTER_PRELOAD: tuple[str, ...] = ()


def enabled_by_env() -> bool:
    """False when ``RLMESH_FORKSERVER=0`` (or ``false``/``no``/``off``) opts out."""
    return settings.FORKSERVER.get()


# ====================================================================== controller side
class ForkedProcHandle:
    """A worker forked by a :class:`ForkServer`; same ``poll()``/``kill()`` contract as ``LocalProcHandle``.

    ``fallback`` starts the same worker the plain way (a fresh Python). It is used when the server
    dies before it forked this request (a template killed, or one whose own start failed): the
    template is only a shortcut, and its failure must not fail a proc that would start fine.
    """

    def __init__(self, server: "ForkServer", rid: int, fallback: Callable[[], Any] | None = None):
        self.server = server
        self.rid = rid
        self._fallback = fallback
        self._plain: Any = None  # the fallback's handle, once the server died before forking
        self._killed = False

    def _started_plainly(self) -> Any:
        """The fallback's handle when the server died before forking this request (started on first look)."""
        if self._plain is None and self._fallback is not None and not self._killed:
            s = self.server
            if s.dead and s._pids.get(self.rid) is None and self.rid not in s._errors:
                fallback, self._fallback = self._fallback, None
                try:
                    self._plain = fallback()
                except Exception:  # noqa: BLE001 - reported below as the server's death, as before
                    logger.warning("fork server %s died; starting request %d afresh failed too", s.name, self.rid,
                                   exc_info=True)
                else:
                    logger.info("fork server %s died before forking request %d: started afresh", s.name, self.rid)
        return self._plain

    @property
    def pid(self) -> int | None:
        if self._plain is not None:
            return self._plain.pid
        return self.server._pids.get(self.rid)

    @property
    def local_pid(self) -> int | None:
        """For the supervisor's ``/proc/<pid>/stat`` check; None once reaped (the pid may be reused)."""
        if self._plain is not None:
            return self._plain.local_pid
        pid = self.pid
        return None if pid is None or self.rid in self.server._status else pid

    def poll(self) -> tuple[int | None, int | None] | tuple[int | None, int | None, str] | None:
        s = self.server
        pid = s._pids.get(self.rid)
        if pid is None:
            err = s._errors.get(self.rid)
            if err is not None:
                return (None, None, f"the fork server could not fork it: {err}")
            if s.dead:
                plain = self._started_plainly()
                if plain is not None:
                    return plain.poll()
                return (None, None, "the fork server died before forking it")
            return None
        st = s._status.get(self.rid)
        if st is not None:
            return st
        if s.dead:  # nobody reports its exit any more: look whether it still exists
            if not pid_running(pid):
                return (None, None, "exited after its fork server died (its exit status went with it)")
        return None

    def kill(self) -> None:
        self._killed = True
        if self._plain is not None:
            self._plain.kill()
            return
        s = self.server
        pid = self.pid
        if pid is None:
            s._kill_on_fork.add(self.rid)
            return
        if self.rid in s._status:
            return  # already reaped: the pid may belong to someone else now
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ForkServer:
    """The controller's side of one fork server: starts it, sends requests, tracks its children.

    Create it on a long-lived thread (the supervisor's): the server's
    ``PR_SET_PDEATHSIG`` fires when the thread that started it ends.
    """

    def __init__(self, python: str, env: dict[str, str], cwd: str, preload: Iterable[str] = DEFAULT_PRELOAD,
                 name: str = "", on_exit: Callable[[], None] | None = None, parent: "ForkServer | None" = None):
        """``parent``: a running template (the start-up one) to fork this one from instead of starting
        Python: it has the worker runtime, and torch where the controller imported it, already
        imported, so this template costs a fork, not ~1.4 s of CPU and ~230 MB of its own."""
        preload = tuple(preload)
        self.name = name
        self.on_exit = on_exit  # called on the reader thread when a child's exit is reported (wake a poller)
        self.ready = threading.Event()
        self.dead = False
        self.warned = False
        self._pids: dict[int, int] = {}
        self._errors: dict[int, str] = {}
        self._status: dict[int, tuple[int | None, int | None]] = {}  # request id -> (exit code, signal)
        self._kill_on_fork: set[int] = set()
        self._next_id = 0
        self.preloaded: set[str] = set(preload)  # imported before any fork: at start, or with preload(now=True)
        self._lock = threading.Lock()
        self.popen: subprocess.Popen | None = None
        self.pid: int | None = None  # known at once when started as a process; from its ready message when forked
        self._forked: ForkedProcHandle | None = None  # this template, as the child of ``parent``
        self._conn: socket.socket | None = None
        self._unsent: list[bytes] = []  # requests written before a forked template connected
        self._closing = False
        if parent is not None:
            try:
                self._fork_from(parent, env, cwd, preload)
                return
            except OSError:  # e.g. a socket path over the 108-byte limit (a long TMPDIR): start Python instead
                logger.info("fork server %s: cannot fork it from the start-up template; starting it afresh",
                            name, exc_info=True)
                self._forked = None
        req_r, self._req_w = os.pipe()
        self._st_r, st_w = os.pipe()
        try:
            self.popen = subprocess.Popen(
                [python, "-m", "rlmesh.worker", "--fork-server", "--fds", f"{req_r},{st_w}",
                 "--parent-pid", str(os.getpid()), "--preload", ",".join(preload)],
                env=env, cwd=cwd, stdin=subprocess.DEVNULL, pass_fds=(req_r, st_w))
        except BaseException:
            os.close(self._req_w)
            os.close(self._st_r)
            raise
        finally:
            os.close(req_r)
            os.close(st_w)
        self.pid = self.popen.pid
        self._reader = threading.Thread(target=self._read, name=f"rlmesh-forkserver-{name}", daemon=True)
        self._reader.start()

    def _fork_from(self, parent: "ForkServer", env: dict[str, str], cwd: str, preload: tuple[str, ...]) -> None:
        """Ask ``parent`` to fork this template; it connects back to a socket only this user can reach
        (a fresh 0700 folder), which then carries requests and replies as the two pipes would."""
        self._dir = tempfile.mkdtemp(prefix="rlmesh-template-")
        addr = os.path.join(self._dir, "s")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(addr)
            listener.listen(1)
            listener.settimeout(0.2)
            rid = parent._request_id()
            parent._write({"op": "template", "id": rid, "addr": addr, "env": env, "cwd": cwd,
                           "preload": list(preload)})
        except BaseException:
            listener.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._forked = ForkedProcHandle(parent, rid)
        self._reader = threading.Thread(target=self._accept_then_read, args=(listener,),
                                        name=f"rlmesh-forkserver-{self.name}", daemon=True)
        self._reader.start()

    def _accept_then_read(self, listener: socket.socket) -> None:
        """Wait for the forked template to connect (or for its fork to fail, or its parent to die), then read."""
        conn = None
        try:
            while conn is None and not self._closing and self._forked is not None and self._forked.poll() is None:
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    continue
        except OSError:
            logger.warning("fork server %s: its template did not connect", self.name, exc_info=True)
        finally:
            listener.close()
            shutil.rmtree(self._dir, ignore_errors=True)
        if conn is None:
            logger.info("fork server %s: forking its template failed (%s); restarts start afresh", self.name,
                        "closed first" if self._closing else (self._forked.poll() if self._forked else None))
            self.dead = True
            return
        conn.settimeout(None)
        with self._lock:
            self._conn, self._req_w, self._st_r = conn, conn.fileno(), os.dup(conn.fileno())
            unsent, self._unsent = self._unsent, []
            try:
                for data in unsent:
                    self._send_all(data)
            except OSError:
                pass  # it died already: the read below ends at once and marks it dead
        self._read()

    @property
    def usable(self) -> bool:
        return self.ready.is_set() and not self.dead

    def _write(self, msg: dict) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self._lock:
            if self._closing:  # its descriptors are closed (their numbers may already be reused)
                raise BrokenPipeError(f"the fork server {self.name} is closed")
            if self._forked is not None and self._conn is None:
                if self.dead:
                    raise BrokenPipeError(f"the fork server {self.name} is gone")
                self._unsent.append(data)  # sent in order once it connects
                return
            self._send_all(data)

    def _send_all(self, data: bytes) -> None:
        while data:
            n = os.write(self._req_w, data)
            data = data[n:]

    def _request_id(self) -> int:
        """A new id for a request to this server: its replies and its child's exit come back under it."""
        with self._lock:
            self._next_id += 1
            return self._next_id

    def fork(self, argv: list[str], env: dict[str, str], cwd: str, wait_s: float = 0.05,
             fallback: Callable[[], Any] | None = None) -> ForkedProcHandle:
        """Ask for a worker running ``rlmesh.worker`` ``main(argv)``; waits at most ``wait_s`` for its pid.
        ``fallback``: starts the worker afresh should the server die before forking it."""
        rid = self._request_id()
        self._write({"op": "fork", "id": rid, "argv": argv, "env": env, "cwd": cwd})
        handle = ForkedProcHandle(self, rid, fallback)
        deadline = time.monotonic() + wait_s
        while handle.pid is None and rid not in self._errors and not self.dead and time.monotonic() < deadline:
            time.sleep(0.0005)
        return handle

    def preload(self, modules: list[str], now: bool = False) -> None:
        """Have the server import ``modules`` between requests (failures are logged there and ignored);
        ``now``: before it serves the requests that follow this one (forks then find them imported)."""
        if modules and not self.dead:
            if now:
                self.preloaded.update(modules)
            try:
                self._write({"op": "preload", "modules": list(modules), "now": now})
            except OSError:
                pass

    def _read(self) -> None:
        buf = b""
        try:
            while True:
                data = os.read(self._st_r, 65536)
                if not data:
                    break
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self._on_message(json.loads(line))
        except Exception:  # noqa: BLE001
            logger.exception("fork server %s: reading its status failed", self.name)
        finally:
            self.dead = True
            os.close(self._st_r)

    def _on_message(self, msg: dict) -> None:
        if msg.get("ready"):
            self.pid = msg.get("pid", self.pid)  # a forked template says which it is
            self.ready.set()
        elif "exit" in msg:
            # By request id, not pid: pids are reused (a long run forks thousands of procs), and an
            # earlier child's exit must never make a later one with the same pid look dead.
            self._status[msg["id"]] = (msg["code"], msg["signal"])
            if self.on_exit is not None:
                try:
                    self.on_exit()
                except Exception:  # noqa: BLE001
                    logger.debug("fork server %s: on_exit callback failed", self.name, exc_info=True)
        elif "pid" in msg:
            self._pids[msg["id"]] = msg["pid"]
            if msg["id"] in self._kill_on_fork:
                try:
                    os.kill(msg["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        elif "error" in msg:
            self._errors[msg["id"]] = msg["error"]

    def close(self, timeout: float = 3.0) -> None:
        """Stop the server (its request pipe closes) and make sure none of its children outlive it."""
        self._closing = True
        with self._lock:
            if self._forked is not None and self._conn is None:
                self._forked.kill()  # never connected: it served nothing (killed as soon as it is forked)
            elif self._conn is not None:
                try:
                    self._conn.shutdown(socket.SHUT_WR)  # its reading end sees the end, as a closed pipe
                except OSError:
                    pass
                self._conn.close()
            elif self._forked is None:
                try:
                    os.close(self._req_w)
                except OSError:
                    pass
        if self.popen is not None:
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        elif self._forked is not None:
            deadline = time.monotonic() + timeout
            while self._forked.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if self._forked.poll() is None:
                self._forked.kill()
        self._reader.join(1)
        for rid, pid in list(self._pids.items()):
            if rid not in self._status:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
