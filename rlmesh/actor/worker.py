"""A worker proc: joins a controller, hosts actors, heartbeats, and exits when the controller is gone.

Run as ``python -m rlmesh.worker --controller tcp://HOST:PORT#m<nonce> --proc-id ID ...`` (the
address exactly as the controller advertises it, channel nonce included; the local
launcher and Kubernetes pods use the same entry point). The job secret
comes in the ``RLMESH_SECRET`` environment variable, never on the command line.

Threads: the main thread runs the asyncio loop with the :class:`ActorServer`;
the control thread owns the connection to the controller (hello, heartbeats,
spawn requests, directory updates, KV); each actor has its own thread; the
client IO thread exists once the actor calls other actors. The heartbeat lives
on the control thread so a busy actor (even a sync endpoint that runs for
minutes) keeps its proc alive, while a proc frozen with the GIL held stops
heartbeating and is declared dead.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import ctypes
import itertools
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from typing import Any

import zmq

try:
    import uvloop
except ImportError:  # a dependency everywhere but Windows (pyproject.toml); asyncio's own loop serves there
    uvloop = None  # type: ignore[assignment]  # absent: asyncio's own loop

from rlmesh import settings
from rlmesh.actor import debugger, hooks, kv, stdio
from rlmesh.actor import protocol as P
from rlmesh.actor.beats import BoardSlot
from rlmesh.actor.client import Client, set_client_factory
from rlmesh.actor.client import error_payload
from rlmesh.actor.context import ProcInfo, _mark_stopping, _set_proc, current_context, proc_stopping
from rlmesh.actor.pids import pid_exists
from rlmesh.actor.server import ActorServer
from rlmesh.errors import quiet_storage_tracebacks
from rlmesh.transport.auth import AuthError, Authenticator
from rlmesh.transport.serialization import loads
from rlmesh.transport.sockets import connect_channel, tune, zmq_context

logger = logging.getLogger("rlmesh.worker")

HEARTBEAT_S_ENV = settings.HEARTBEAT_S.name
CONTROLLER_TIMEOUT_ENV = settings.CONTROLLER_TIMEOUT_S.name
EVENT_LOOP_ENV = settings.EVENT_LOOP.name
"""``uvloop`` (the default where it is installed) or ``asyncio``: the event loop a worker serves its actors on."""
CANCEL_GRACE_S = 2.0
"""How long the async calls a stopping proc cancels may take to finish their cleanup (``finally``)."""


class _WhereFilter(logging.Filter):
    """Prefix every log record with the actor (mesh[rank]) or proc it comes from."""

    def __init__(self, proc: ProcInfo):
        super().__init__()
        self.proc = proc

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = current_context()
        record.rlmesh_where = (f"{ctx.mesh_name}[{ctx.rank}]" if ctx
                               else f"{self.proc.proc_mesh}[{self.proc.rank}]")
        return True


def _resolve(fut: concurrent.futures.Future, reply: dict) -> None:
    """Set a request's reply unless it was answered already (the link thread and a stop can race)."""
    try:
        fut.set_result(reply)
    except concurrent.futures.InvalidStateError:
        pass


class RemoteKV:
    """KV backend for workers: requests go to the controller's table over the control link."""

    def __init__(self, link: "ControlLink"):
        self.link = link

    def _req(self, op: str, key: str = "", value: Any = None, timeout: float | None = None,
             waits: bool = False) -> Any:
        fut = self.link.request(P.KV_REQ, waits=waits, op=op, key=key, value=value, timeout=timeout)
        rep = fut.result(None if timeout is None else timeout + 10)
        if not rep["ok"]:
            raise KeyError(rep["error"])
        return rep.get("value")

    def put(self, key: str, value: Any) -> None:
        self._req("put", key, value)

    def get(self, key: str, timeout: float | None = None) -> Any:
        """Waits (up to ``timeout``) for ``key`` to appear, but not past this proc's stop: a wait
        for a key that a stopped peer will never write (a weight publisher's record) would hold the
        endpoint, and so ``on_stop`` and the proc's exit, for its whole timeout. Once the proc is
        stopping (``on_stop`` included) a get still answers with a key that is there; it only no
        longer waits for one that is not."""
        if (timeout is not None and timeout <= 0) or proc_stopping():
            return self._req("get", key, timeout=0)
        return self._req("get", key, timeout=timeout, waits=True)

    def delete(self, key: str) -> None:
        self._req("delete", key)

    def keys(self, prefix: str = "") -> list[str]:
        return self._req("keys", prefix)


class ControlLink(threading.Thread):
    """The worker's connection to the controller (one DEALER, owned by this thread)."""

    def __init__(self, worker: "Worker"):
        super().__init__(name="rlmesh-control", daemon=True)
        self.w = worker
        self.outq: deque = deque()  # (kind, fields): signed on this thread, so counters leave in order
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.reqs: dict[int, concurrent.futures.Future] = {}
        self.waits: set[int] = set()  # requests whose reply may be held (KV gets): answered at stop
        self.ids = itertools.count(1)
        self.hb_s = settings.HEARTBEAT_S.get()
        self.controller_timeout = settings.CONTROLLER_TIMEOUT_S.get()
        self.stopping = False
        self.hung = False
        self.board = BoardSlot.from_env()  # on the controller's host: beats are a store to shared memory

    def send(self, kind: str, **fields: Any) -> None:
        self.outq.append((kind, fields))
        os.eventfd_write(self.efd, 1)

    def request(self, kind: str, waits: bool = False, **fields: Any) -> concurrent.futures.Future:
        """Send a request; its reply resolves the future. ``waits``: the controller may hold the reply
        (a KV get for a key not there yet), so :meth:`give_up_waits` answers it when the proc stops."""
        rid = next(self.ids)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.reqs[rid] = fut
        if waits:
            self.waits.add(rid)
        self.send(kind, req=rid, **fields)
        # A stop that came after the caller looked, but before this wait was registered, gave up the
        # waits without it: the flag is set before they are given up, so looking again closes that window.
        if waits and proc_stopping():
            self.give_up_waits()
        return fut

    def give_up_waits(self) -> None:
        """Answer every waiting request now: this proc is stopping (any thread; a reply that comes later
        is dropped)."""
        for rid in list(self.waits):
            fut = self.reqs.pop(rid, None)
            self.waits.discard(rid)
            if fut is not None:
                _resolve(fut, {"ok": False, "error": "not waited for any longer: this proc is stopping"})

    def run(self) -> None:
        w = self.w
        sock = tune(zmq_context().socket(zmq.DEALER))
        sock.setsockopt(zmq.IDENTITY, f"{w.proc.proc_id}#{w.proc.incarnation}".encode())
        out = connect_channel(sock, w.auth, w.controller)
        replies = out.reply_inbound(f"controller messages to {w.proc.proc_id}")

        def flush() -> None:
            while self.outq:
                kind, fields = self.outq.popleft()
                sock.send_multipart(P.control(out, kind, **fields), copy=False)

        sock.send_multipart(P.control(out, P.HELLO, proc_id=w.proc.proc_id, incarnation=w.proc.incarnation,
                                      pid=os.getpid(), host=w.proc.host, addr=w.server.addr))
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self.efd, zmq.POLLIN)
        if w.parent_fd is not None:  # a pidfd of the controller: readable the moment it exits
            poller.register(w.parent_fd, zmq.POLLIN)
        last_hb = 0.0
        last_heard = time.monotonic()
        while not self.stopping:
            for s, _ in poller.poll(int(self.hb_s * 1000)):
                if s == w.parent_fd:
                    controller_gone(f"the controller (pid {w.parent_pid}) is gone")
                if s == self.efd:
                    try:
                        os.eventfd_read(self.efd)
                    except BlockingIOError:
                        pass
                    continue
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    last_heard = time.monotonic()
                    try:
                        kind, msg = P.read_control(replies, frames)
                    except AuthError:
                        continue  # counted, and logged at most once per interval, by the channel
                    except Exception as exc:
                        logger.warning("refused a control message: %s", exc)
                        continue
                    self.handle(kind, msg)
            flush()
            now = time.monotonic()
            if now - last_hb >= self.hb_s and not self.hung:
                if self.board is not None:
                    self.board.beat()
                else:
                    sock.send_multipart(P.control(out, P.HEARTBEAT, proc_id=w.proc.proc_id))
                last_hb = now
            if now - last_heard > self.controller_timeout and w.parent_pid <= 0:
                # Only where the OS cannot say (pods, remote hosts): a local proc knows its controller
                # lives from its parent (the kernel kills it, or reparents it, when that dies), and a
                # controller starved on a busy host must not make its live workers quit.
                controller_gone(f"no word from the controller for {now - last_heard:.0f}s")
            if w.parent_pid > 0 and w.parent_fd is None and os.getppid() != w.parent_pid and not pid_exists(w.parent_pid):
                controller_gone(f"the process that launched this one (pid {w.parent_pid}) is gone")
        flush()
        sock.close(linger=200)

    def handle(self, kind: str, msg: dict) -> None:
        w = self.w
        if kind == P.HB_ACK:
            hb = msg.get("hb_s")
            # the supervisor spaces message beats out as N grows; board beats cost it nothing
            if hb and not settings.HEARTBEAT_S.is_set() and self.board is None:
                self.hb_s = float(hb)
            return
        if kind == P.SPAWN:
            fut = asyncio.run_coroutine_threadsafe(w.spawn(msg), w.loop)
            fut.add_done_callback(lambda f, req=msg["req"]: self._spawned(req, f))  # type: ignore[misc]  # a lambda with a default argument (binds the loop's value): mypy cannot infer it
        elif kind == P.PROC_UP:
            w.directory_update(msg, up=True)
        elif kind == P.DIRECTORY:
            for proc_id, addr, incarnation in msg["up"]:
                w.directory_update({"proc_id": proc_id, "addr": addr, "incarnation": incarnation}, up=True)
        elif kind == P.PROC_DOWN:
            for proc_id, incarnation, exit_code, sig, reason in msg["down"]:
                w.directory_update({"proc_id": proc_id, "incarnation": incarnation, "exit_code": exit_code,
                                    "signal": sig, "reason": reason}, up=False)
        elif kind == P.KV_REP:
            fut = self.reqs.pop(msg["req"], None)  # type: ignore[arg-type]  # None: an answer nobody waits for
            self.waits.discard(msg["req"])
            if fut is not None:
                _resolve(fut, msg)
        elif kind == P.STOP:
            w.exit_soon(0)
        elif kind == P.FENCED:
            fenced(f"{w.proc.proc_id} was replaced by incarnation {msg['incarnation']} while this one "
                   f"({w.proc.incarnation}) was out of reach")
        elif kind == P.HANG:
            logger.warning("fault injection: this proc now hangs (no heartbeats, no calls served)")
            self.hung = True
            w.loop.call_soon_threadsafe(time.sleep, 10**9)

    def _spawned(self, req: int, f: concurrent.futures.Future) -> None:
        exc = f.exception()
        if exc is None:
            self.send(P.SPAWNED, req=req, ok=True, error=None)
        else:
            self.send(P.SPAWNED, req=req, ok=False, error=loads(error_payload(exc)))


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The worker's loop: uvloop's where it is installed (a dependency on Linux and macOS), else asyncio's;
    ``RLMESH_EVENT_LOOP=asyncio`` or ``=uvloop`` chooses. Why uvloop: the loop's own turn is part of
    every async call served, and uvloop's is in C: 8-13 µs less CPU a round trip, 6-8 % of it
    (docs/performance.md, "uvloop by default"). A loop asked for by name that is not installed fails
    the proc's start with the fix, rather than running on another loop unseen."""
    kind = settings.EVENT_LOOP.get() or ("uvloop" if uvloop is not None else "asyncio")  # a bad value raises
    if kind == "asyncio":
        return asyncio.new_event_loop()
    if uvloop is None:
        raise RuntimeError(f"{EVENT_LOOP_ENV}=uvloop but uvloop is not installed: pip install uvloop, or unset it")
    return uvloop.new_event_loop()


class Worker:
    def __init__(self, controller: str, proc: ProcInfo, parent_pid: int = 0, parent_fd: int | None = None):
        self.controller = controller
        self.parent_pid = parent_pid
        self.parent_fd = parent_fd  # a pidfd of parent_pid when this proc was forked from a template
        self.proc = proc
        self.auth = Authenticator.from_env()
        self.loop = new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.server = ActorServer(self.auth, proc, self.loop)
        self.link = ControlLink(self)
        self.client: Client | None = None
        self._dir: dict[str, tuple[str, int, bool, dict]] = {}
        self._exit_code: int | None = None
        self._done = asyncio.Event()
        set_client_factory(self._make_client)
        kv.set_backend(RemoteKV(self.link))
        _set_proc(proc)

    def _make_client(self) -> Client:
        c = Client(self.auth, identity=self.proc.proc_id)
        for pid_, (addr, inc, up, info) in list(self._dir.items()):
            if up:
                c.proc_up(pid_, addr, inc)
            else:
                c.proc_down(pid_, inc, info.get("exit_code"), info.get("signal"), info.get("reason", ""))
        self.client = c
        return c

    def directory_update(self, msg: dict, up: bool) -> None:
        self._dir[msg["proc_id"]] = (msg.get("addr", ""), msg["incarnation"], up, msg)
        if self.client is not None:
            if up:
                self.client.proc_up(msg["proc_id"], msg["addr"], msg["incarnation"])
            else:
                self.client.proc_down(msg["proc_id"], msg["incarnation"], msg.get("exit_code"),
                                      msg.get("signal"), msg.get("reason", ""))

    async def spawn(self, msg: dict) -> None:
        for spec in msg["specs"]:
            await self.server.spawn(spec, msg["cls"], msg["restarted"])

    def exit_soon(self, code: int) -> None:
        """Ask the loop to shut down cleanly (actors' on_stop, shutdown hooks) and exit with ``code``."""
        if self._exit_code is None:
            self._exit_code = code
            _mark_stopping()  # endpoints blocked in framework waits give up now, so on_stop is not held
            self.link.give_up_waits()
            self.loop.call_soon_threadsafe(self._done.set)

    def _on_sigterm(self) -> None:
        """Stop cleanly, unless a plugin handles SIGTERM (a Slurm step: the controller leads the stop)."""
        handler = hooks.sigterm_handler()
        if handler is None or not handler():
            self.exit_soon(0)

    async def _main(self) -> int:
        self.link.start()
        self.loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)  # kill, a pod's deletion: stop cleanly
        # Ctrl-C reaches every process of the terminal's group, and it is the controller's to handle: it
        # stops its procs in order. A worker that exited on it by itself would look dead to a controller
        # that had not yet seen its own SIGINT (a busy machine), which would restart it mid-stop.
        self.loop.add_signal_handler(signal.SIGINT, _ctrl_c_is_the_controllers)
        await self._done.wait()
        try:
            await asyncio.wait_for(self.server.stop_actors(), timeout=15)
        except Exception:
            logger.exception("stopping actors failed")
        await self.server.cancel_calls(timeout=CANCEL_GRACE_S)
        hooks.run_shutdown_hooks()
        self.link.send(P.BYE, proc_id=self.proc.proc_id)
        self.link.stopping = True
        os.eventfd_write(self.link.efd, 1)
        self.link.join(timeout=2)
        return self._exit_code or 0

    def run(self) -> int:
        hooks.run_worker_plugins(hooks.WorkerInfo(
            proc_id=self.proc.proc_id, proc_mesh=self.proc.proc_mesh, rank=self.proc.rank,
            incarnation=self.proc.incarnation, pid=self.proc.pid, host=self.proc.host,
            controller_addr=self.controller))
        try:
            return self.loop.run_until_complete(self._main())
        finally:
            self.server.close()
            if self.client is not None:
                self.client.close()


def _ctrl_c_is_the_controllers() -> None:
    logger.debug("SIGINT ignored: the controller stops this proc (Ctrl-C reached the whole process group)")


def controller_gone(why: str) -> None:
    """The controller is dead: exit now, running nothing (no ``on_stop``, no shutdown hooks).

    Its run is over or will be resumed from the newest checkpoint; a worker that went on
    (a trainer finishing its step and saving) would write into a run nobody supervises,
    possibly while ``resume`` already started a new trainer on the same directory."""
    logger.error("%s: the controller is gone; exiting without writing anything", why)
    try:
        logging.shutdown()
        sys.stderr.flush()
    finally:
        os._exit(3)


def fenced(why: str) -> None:
    """This incarnation was replaced (its host was cut off, declared dead, and came back): exit now,
    running nothing, as :func:`controller_gone` does: its replacement owns the actors' state."""
    logger.error("%s: fenced by the controller; exiting without writing anything", why)
    try:
        logging.shutdown()
        sys.stderr.flush()
    finally:
        os._exit(FENCED_EXIT)


FENCED_EXIT = 4
"""A fenced incarnation's exit status (3: the controller is gone)."""


def _name_process(name: str) -> None:
    """Linux: name this process ``<proc id>/<incarnation>`` (what ``ps -o comm``, ``top`` and
    ``psutil.Process.name()`` show; 15 bytes at most). A proc forked from a warm template keeps the
    template's command line, so without this nothing outside rlmesh could tell its procs apart."""
    prctl(15, name.encode()[:15])  # PR_SET_NAME


def prctl(option: int, arg: object) -> bool:
    """Linux ``prctl(option, arg)``; False where there is no such call (another OS, no glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return True


def _die_with_parent(parent_pid: int) -> int | None:
    """Linux: exit the moment the controller that launched us dies (no orphans, nothing written).

    Started by the controller itself (a fresh Python): ``PR_SET_PDEATHSIG`` with SIGKILL. It fires
    when the launching *thread* ends: the controller launches from its supervisor thread, which
    lives as long as the controller. SIGKILL rather than SIGTERM: a trainer must not run
    ``on_stop`` (a checkpoint save) for a controller that is gone.

    Forked from a warm template (the launcher passes the controller's pid, not the template's):
    no death signal, since it would tie this proc to the template, and a template's death must
    cost the procs it forked nothing (a SIGKILLed template used to take every one of them down).
    Instead a pidfd of the controller, which the control thread polls with its sockets and exits
    on at once; returned here. Where pidfds are missing, the control thread checks the pid."""
    if parent_pid <= 0:
        return None
    if os.getppid() == parent_pid:
        if prctl(1, signal.SIGKILL) and os.getppid() != parent_pid:  # PR_SET_PDEATHSIG; died before it took effect
            os._exit(3)
        return None
    try:
        return os.pidfd_open(parent_pid)
    except ProcessLookupError:
        os._exit(3)
    except (OSError, AttributeError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlmesh.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--controller", required=True, help="controller address as advertised, e.g. tcp://127.0.0.1:5555#m<32 hex>")
    ap.add_argument("--proc-id", required=True)
    ap.add_argument("--proc-mesh", default="procs")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--incarnation", type=int, default=0)
    ap.add_argument("--parent-pid", type=int, default=0, help="exit when this pid (the controller) dies (local launcher)")
    args = ap.parse_args(argv)
    parent_fd = _die_with_parent(args.parent_pid)
    _name_process(f"{args.proc_id}/{args.incarnation}")
    proc = ProcInfo(proc_id=args.proc_id, proc_mesh=args.proc_mesh, rank=args.rank, pid=os.getpid(),
                    host=socket.gethostname(), incarnation=args.incarnation,
                    job_id=settings.JOB_ID.get())
    level = settings.LOG_LEVEL.get()
    if not stdio.attach(proc, level):  # captured: the launcher stores and shows every record
        logging.basicConfig(
            level=level, format="%(asctime)s %(levelname)s [%(rlmesh_where)s pid=%(process)d] %(name)s: %(message)s")
        for h in logging.getLogger().handlers:
            h.addFilter(_WhereFilter(proc))
    quiet_storage_tracebacks()  # a full disk: one line (an on_stop's final checkpoint), not a traceback
    debugger.install()  # breakpoint() in an endpoint pauses that actor for `rlmesh debug`
    code = Worker(args.controller, proc, args.parent_pid, parent_fd).run()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # do not wait on leftover non-daemon threads started by user code
