"""A warm template for restarting local worker procs: fork a pre-imported process instead of starting Python.

Why: a replacement proc started with ``python -m rlmesh.worker`` spends about a
second starting the interpreter and importing torch / gymnasium before it can
serve. The fork server is a process started once per restartable proc mesh,
with the same interpreter, environment and working directory a worker of that
mesh would get. It imports :mod:`rlmesh.worker`, numpy and torch (and later the
modules the mesh's actor classes live in) and then waits. A relaunch asks it to
``fork()``; the child sets its environment, working directory and ``sys.path``
exactly as a fresh worker would have them and runs the worker's ``main``.

When: only for procs of meshes whose ``Restart`` policy allows restarts, only
for relaunches (first launches are plain ``Popen``), only with the local
launcher, and not when ``RLMESH_FORKSERVER=0``.

Rules the server keeps so that ``fork()`` is safe: it starts no rlmesh runtime
(no sockets, no threads of its own), it dies with the controller
(``PR_SET_PDEATHSIG`` plus exit when its request pipe closes), and its children
die with it (they set ``PR_SET_PDEATHSIG`` relative to the server). Children are
not the controller's children, so the server reaps them and reports
``pid -> (exit_code, signal)`` on a status pipe; :class:`ForkServer` (the
controller's side) reads it on a thread, and :class:`ForkedProcHandle` answers
``poll()`` from that table without blocking.

Protocol (one JSON object per line): requests ``{"op": "fork", "id", "argv",
"env", "cwd"}`` and ``{"op": "preload", "modules", "now"}`` (``now``: import before serving the
next request, else between requests); replies ``{"ready": true}``,
``{"id", "pid"}`` or ``{"id", "error"}``, and ``{"exit": pid, "code", "signal"}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Callable, Iterable

from rlmesh.actor import worker as actor_worker  # what every forked child runs, imported before any fork
from rlmesh.actor.hooks import WORKER_PLUGINS_ENV
from rlmesh.actor.payload import SKIP_PRELOAD

logger = logging.getLogger(__name__)

FORKSERVER_ENV = "RLMESH_FORKSERVER"
DEFAULT_PRELOAD = ("numpy", "torch")
FRESH_IMPORTS_ENV = "RLMESH_FRESH_IMPORTS"
"""Folders (os.pathsep-separated) whose modules a forked child must import afresh, not inherit
from the template: a synced workspace (rlmesh.workspace sets it on the procs it activated)."""
# The start-up template (first launches) imports only what every worker imports anyway: the
# worker itself and the worker plugins named in its environment. Not torch: its ~3 s import
# would hold back every first launch, and many procs (buffers, reward) never use it.
STARTER_PRELOAD: tuple[str, ...] = ()


def enabled_by_env() -> bool:
    """False when ``RLMESH_FORKSERVER=0`` (or ``false``/``no``/``off``) opts out."""
    return os.environ.get(FORKSERVER_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


# ====================================================================== controller side
def _exists(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaps counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


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
            if not _exists(pid):
                return (None, None, "exited after its fork server died")
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
                 name: str = "", on_exit: Callable[[], None] | None = None):
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

    @property
    def usable(self) -> bool:
        return self.ready.is_set() and not self.dead

    def _write(self, msg: dict) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self._lock:
            while data:
                n = os.write(self._req_w, data)
                data = data[n:]

    def fork(self, argv: list[str], env: dict[str, str], cwd: str, wait_s: float = 0.05,
             fallback: Callable[[], Any] | None = None) -> ForkedProcHandle:
        """Ask for a worker running ``rlmesh.worker`` ``main(argv)``; waits at most ``wait_s`` for its pid.
        ``fallback``: starts the worker afresh should the server die before forking it."""
        with self._lock:
            self._next_id += 1
            rid = self._next_id
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
        if "exit" in msg:
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
        elif msg.get("ready"):
            self.ready.set()

    def close(self, timeout: float = 3.0) -> None:
        """Stop the server (its request pipe closes) and make sure none of its children outlive it."""
        try:
            os.close(self._req_w)
        except OSError:
            pass
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self._reader.join(1)
        for rid, pid in list(self._pids.items()):
            if rid not in self._status:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


# ====================================================================== server side
_status_fd = -1
_children: dict[int, int] = {}  # pid -> request id


def _send(msg: dict) -> None:
    """One ``os.write`` per message, under ``PIPE_BUF``: atomic, even when a SIGCHLD handler interleaves."""
    os.write(_status_fd, (json.dumps(msg) + "\n").encode())


def _reap(*_: Any) -> None:
    while _children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        rid = _children.pop(pid, None)
        if rid is None:
            continue
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        _send({"exit": pid, "id": rid, "code": code, "signal": sig})


def _die_with_parent(parent_pid: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    actor_worker.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(3)


def _import(mod: str) -> None:
    if mod in sys.modules or mod in SKIP_PRELOAD:
        return
    t = time.monotonic()
    try:
        __import__(mod)
        logger.debug("fork server preloaded %s in %.2fs", mod, time.monotonic() - t)
    except BaseException as exc:  # noqa: BLE001 - a module that fails to import here is imported by the worker
        logger.warning("fork server: preloading %s failed (%s: %s); workers import it themselves",
                       mod, type(exc).__name__, exc)


def _child(msg: dict, close_fds: list[int]) -> None:
    """In the forked child: become the worker a fresh ``python -m rlmesh.worker`` would have been."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # SIGINT stays ignored, as in the template, until the worker installs its own handler: a Ctrl-C
    # during its start must not kill it (the controller stops it; see rlmesh.actor.worker)
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    env = msg["env"]
    os.chdir(msg["cwd"])
    os.environ.clear()
    os.environ.update(env)
    for p in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if p not in sys.path:
            sys.path.insert(1, p)
    _forget_modules_under([p for p in env.get(FRESH_IMPORTS_ENV, "").split(os.pathsep) if p])
    sys.argv = ["rlmesh.worker", *msg["argv"]]
    np = sys.modules.get("numpy")
    if np is not None:  # a fresh process would not share the template's global RNG state
        try:
            np.random.seed()
        except Exception:  # noqa: BLE001
            pass
    actor_worker.main(msg["argv"])  # ends with os._exit


def _forget_modules_under(folders: list[str]) -> None:
    """Drop the template's modules imported from ``folders`` (a synced workspace that changed since
    the template imported them), so the child imports today's files, as a fresh Python would."""
    if not folders:
        return
    roots = tuple(os.path.realpath(f) + os.sep for f in folders)
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if name.split(".")[0] == "rlmesh":  # the worker runs on these: a checkout synced as the tree keeps them
            continue
        if isinstance(f, str) and os.path.realpath(f).startswith(roots):
            del sys.modules[name]


def _fork(msg: dict, close_fds: list[int]) -> None:
    # SIGCHLD stays blocked until the child is registered: a child that dies at once is reported
    # under its request id, never missed (the handler reaps only what it knows).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # threads of preloaded C libraries
            pid = os.fork()
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        _send({"id": msg["id"], "error": str(exc)})
        return
    if pid != 0:
        _children[pid] = msg["id"]
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    if pid == 0:
        code = 1
        try:
            _child(msg, close_fds)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    _send({"id": msg["id"], "pid": pid})


def serve(req_fd: int, status_fd: int, parent_pid: int, preload: list[str]) -> int:
    """The server's loop: preload, say ready, then fork on request until the request pipe closes."""
    global _status_fd
    _status_fd = status_fd
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, _reap)  # reaps (and reports) even while a preload import runs
    close_fds = [req_fd, status_fd, wake_r, wake_w]
    plugins = [s.split(":", 1)[0].strip() for s in os.environ.get(WORKER_PLUGINS_ENV, "").split(",") if s.strip()]
    for mod in [*preload, *plugins]:  # worker plugins' modules are imported, never run, here
        _import(mod)
    # No pyarrow warm-up: telemetry builds its arrays from buffers (rlmesh.telemetry.arrays), so a
    # worker's flushes never import pandas, which warming here cost every first launch (0.25 s).
    pending: list[str] = []
    buf = b""
    try:
        _send({"ready": True})
        poller = select.poll()  # not select(): it refuses fds numbered 1,024 or more
        poller.register(req_fd, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        while True:
            ready = [fd for fd, _ in poller.poll(0 if pending else 1000)]
            if wake_r in ready:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
            _reap()
            if req_fd in ready:
                data = os.read(req_fd, 1 << 20)
                if not data:
                    return 0  # the controller closed the pipe (mesh stopped) or is gone
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    msg = json.loads(line)
                    if msg["op"] == "fork":
                        _fork(msg, close_fds)
                    elif msg["op"] == "preload" and msg.get("now"):
                        for mod in msg["modules"]:
                            _import(mod)
                    elif msg["op"] == "preload":
                        pending.extend(m for m in msg["modules"] if m not in pending)
                continue  # serve every request before the next (slow) import
            if pending:
                _import(pending.pop(0))
    except BrokenPipeError:
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlmesh.worker --fork-server", description=__doc__.split("\n")[0])
    ap.add_argument("--fds", required=True, help="REQUEST_FD,STATUS_FD")
    ap.add_argument("--parent-pid", type=int, required=True)
    ap.add_argument("--preload", default="")
    args = ap.parse_args(argv)
    req_fd, status_fd = (int(x) for x in args.fds.split(","))
    return serve(req_fd, status_fd, args.parent_pid, [m for m in args.preload.split(",") if m])
