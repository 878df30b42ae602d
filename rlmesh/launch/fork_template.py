"""The template process of :mod:`rlmesh.launch.forkserver`: import once, then ``fork()`` workers on request.

Why a module of its own: this is the side that runs in the template (``python -m rlmesh.worker
--fork-server``), and it imports the whole worker runtime (asyncio, zmq, the actor server) before
its first fork, so that every child starts with it imported. The controller's side
(:class:`~rlmesh.launch.forkserver.ForkServer`) only starts the process and talks to it over two
pipes, so it imports none of that: a controller can start its template before it has imported
its own runtime, and the two imports run side by side (:func:`rlmesh.launch.this_host`).

The rules that make ``fork()`` safe here, and the pipe protocol, are in
:mod:`rlmesh.launch.forkserver`.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import select
import signal
import socket
import sys
import time
import traceback
import warnings
from typing import Any, Callable

from rlmesh import settings
from rlmesh.actor import worker as actor_worker  # what every forked child runs, imported before any fork
from rlmesh.actor.payload import SKIP_PRELOAD
from rlmesh.launch.forkserver import FRESH_IMPORTS_ENV

logger = logging.getLogger(__name__)

_status_fd = -1
_children: dict[int, int] = {}  # pid -> request id
_template_pid = 0  # this template's pid: what a template forked from it checks its parent against


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


def _leave_template(close_fds: list[int]) -> None:
    """In a forked child: drop what belongs to the template (its signal set-up, pipes, children)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # SIGINT stays ignored, as in the template, until the worker installs its own handler: a Ctrl-C
    # during its start must not kill it (the controller stops it; see rlmesh.actor.worker)
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _children.clear()


def _take_environment(msg: dict) -> None:
    """The environment, working directory and ``sys.path`` a fresh ``python -m rlmesh.worker`` would have."""
    env = msg["env"]
    os.chdir(msg["cwd"])
    os.environ.clear()
    os.environ.update(env)
    for p in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if p not in sys.path:
            sys.path.insert(1, p)
    _forget_modules_under([p for p in env.get(FRESH_IMPORTS_ENV, "").split(os.pathsep) if p])


def reseed_global_rngs() -> None:
    """Give a forked child fresh global random states (numpy's, torch's), as a fresh process has
    (Python's ``random`` reseeds itself at fork).

    Why torch's too: a child inherits the template's state, and the template imports torch, so every proc
    forked from one template drew the same torch numbers: two gym generator replicas sampled identical
    action noise and epsilon-greedy choices (correlated exploration, whatever their env seeds). An actor
    that wants reproducible draws seeds them itself, from its config."""
    for name, reseed in (("numpy", lambda m: m.random.seed()), ("torch", lambda m: m.seed())):
        module = sys.modules.get(name)
        if module is not None:
            try:
                reseed(module)
            except Exception:  # noqa: BLE001 - a broken optional module must not stop the worker
                pass


def _child(msg: dict, close_fds: list[int]) -> None:
    """In the forked child: become the worker a fresh ``python -m rlmesh.worker`` would have been."""
    _leave_template(close_fds)
    _take_environment(msg)
    sys.argv = ["rlmesh.worker", *msg["argv"]]
    reseed_global_rngs()
    actor_worker.main(msg["argv"])  # ends with os._exit


def _template_child(msg: dict, close_fds: list[int]) -> None:
    """In the forked child: become a mesh's restart template, talking to the controller over the
    socket it listens on (``msg["addr"]``), with everything this template imported already loaded.
    It dies with this template (which dies with the controller), as this template's workers do."""
    parent = _template_pid
    _leave_template(close_fds)
    _take_environment(msg)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(msg["addr"])
    except OSError:  # the controller gave up on it (the mesh stopped first): nothing to serve, nothing to say
        sys.exit(1)
    fd = sock.detach()
    sys.exit(serve(fd, fd, parent, list(msg.get("preload", ()))))


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


def _fork(msg: dict, close_fds: list[int], become: Callable[[dict, list[int]], None] = _child) -> None:
    """Fork a child that runs ``become(msg, close_fds)`` (a worker, or a restart template), and
    report its pid, and later its exit, under the request's id."""
    # SIGCHLD stays blocked until the child is registered: a child that dies at once is reported
    # under its request id, never missed (the handler reaps only what it knows).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    # Everything the template holds now goes to the collector's permanent generation, in the template
    # and so in the child. Why: a full collection writes into the header of every object it scans,
    # and in a child that copies every page of the template's objects it touches. Measured with torch
    # preloaded (294k objects): a worker's first full collection took its private memory from 17 MB
    # to 81 MB and each one paused its event loop 77-100 ms. Frozen, the child scans only its own.
    gc.freeze()
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
            become(msg, close_fds)
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
    global _status_fd, _template_pid
    _status_fd = status_fd
    _template_pid = os.getpid()
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, _reap)  # reaps (and reports) even while a preload import runs
    close_fds = list(dict.fromkeys([req_fd, status_fd, wake_r, wake_w]))  # one socket serves both ways when forked
    plugins = [s.split(":", 1)[0].strip() for s in settings.WORKER_PLUGINS.get().split(",") if s.strip()]
    for mod in [*preload, *plugins]:  # worker plugins' modules are imported, never run, here
        _import(mod)
    # No pyarrow warm-up: telemetry builds its arrays from buffers (rlmesh.telemetry.arrays), so a
    # worker's flushes never import pandas, which warming here cost every first launch (0.25 s).
    pending: list[str] = []
    buf = b""
    try:
        _send({"ready": True, "pid": os.getpid()})
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
                    elif msg["op"] == "template":
                        _fork(msg, close_fds, _template_child)
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
    ap = argparse.ArgumentParser(prog="python -m rlmesh.worker --fork-server", description="the start-up / restart template of the local launcher")
    ap.add_argument("--fds", required=True, help="REQUEST_FD,STATUS_FD")
    ap.add_argument("--parent-pid", type=int, required=True)
    ap.add_argument("--preload", default="")
    args = ap.parse_args(argv)
    req_fd, status_fd = (int(x) for x in args.fds.split(","))
    return serve(req_fd, status_fd, args.parent_pid, [m for m in args.preload.split(",") if m])
