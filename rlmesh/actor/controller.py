"""The controller's control plane: launches procs, supervises them, restarts them, serves the KV table.

One :class:`Controller` per controller process, created by the first
``spawn_procs``. Its supervisor thread owns the control ROUTER socket: workers
dial in (``HELLO``), heartbeat, answer spawn requests and use the KV table.
Every tick it checks each proc: a launcher-reported exit (exit code / signal)
or a heartbeat older than ``RLMESH_HEARTBEAT_TIMEOUT_S`` (default 1.5 s) makes
the proc dead (while an actor's ``__init__`` runs, the allowance is
``RLMESH_INIT_HEARTBEAT_TIMEOUT_S``, default 30 s: first imports of torch or a
model load can hold the GIL for seconds). Then every future waiting on it fails with ``ActorDied``, the
other procs are told (so their own pending calls fail too), an event goes to
the sinks, and the :class:`Restart` policy decides on a replacement, which gets
its actors re-created from their original constructor arguments.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import zmq

from rlmesh.actor import hooks, kv
from rlmesh.actor import protocol as P
from rlmesh.actor.client import Client, reset_client, set_client_factory
from rlmesh.actor.context import JOB_ID_ENV
from rlmesh.actor.payload import modules_in_payload
from rlmesh.errors import ActorDied, ActorError
from rlmesh.transport.auth import SECRET_ENV, AuthError, Authenticator
from rlmesh.transport.sockets import bind_channel, tune, zmq_context

logger = logging.getLogger(__name__)

HB_TIMEOUT_ENV = "RLMESH_HEARTBEAT_TIMEOUT_S"
INIT_HB_TIMEOUT_ENV = "RLMESH_INIT_HEARTBEAT_TIMEOUT_S"
START_TIMEOUT_ENV = "RLMESH_START_TIMEOUT_S"
CONTROLLER_PORT_ENV = "RLMESH_CONTROLLER_PORT"  # a fixed port (e.g. behind a Kubernetes Service); default: any free one


@dataclass(frozen=True)
class Restart:
    """What to do when a proc dies. ``max_restarts``: 0 never (default), N at most N times, -1 forever.

    ``backoff_s``: wait this long before each replacement is launched.
    """

    max_restarts: int = 0
    backoff_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_restarts, int) or self.max_restarts < -1:
            raise ValueError(f"Restart(max_restarts={self.max_restarts!r}): use 0 (never), N > 0, or -1 (forever)")
        if self.backoff_s < 0:
            raise ValueError(f"Restart(backoff_s={self.backoff_s!r}) must be >= 0 seconds")

    def allows(self, used: int) -> bool:
        return self.max_restarts == -1 or used < self.max_restarts


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a launcher needs to start one worker proc."""

    controller_addr: str
    proc_id: str
    proc_mesh: str
    rank: int
    incarnation: int
    env: dict[str, str]
    restartable: bool = False  # the mesh's Restart policy allows restarts (local launcher: keep a warm template)


class ProcHandle(Protocol):
    """A launched proc as its launcher sees it (a child process, a pod...)."""

    pid: int | None

    def poll(self) -> tuple[int | None, int | None] | tuple[int | None, int | None, str] | None:
        """``None`` while running, else ``(exit_code, signal)`` or ``(exit_code, signal, reason)``.

        Called on the supervisor thread every tick (50 ms): it must not block; a
        launcher that learns about exits asynchronously (a pod watch) caches them.
        """

    def kill(self) -> None:
        """Make sure the proc is gone (SIGKILL, pod deletion). Must not block."""


class Launcher(Protocol):
    """Optional extras, looked up with ``getattr``: ``preload(proc_mesh, modules)`` (the modules the mesh's
    actor classes live in), ``release(proc_mesh)`` (the mesh is gone) and ``close()`` (the controller is)."""

    def launch(self, req: LaunchRequest) -> ProcHandle: ...


def call_launchers(launchers: Any, method: str, *args: Any) -> None:
    """Call an optional launcher method once per distinct launcher; errors are logged, never raised."""
    for launcher in {id(x): x for x in launchers}.values():
        fn = getattr(launcher, method, None)
        if fn is None:
            continue
        try:
            fn(*args)
        except Exception:  # noqa: BLE001
            logger.warning("launcher %s(%s) failed", method, ", ".join(map(repr, args)), exc_info=True)


@dataclass
class ProcRecord:
    proc_id: str
    proc_mesh: str
    rank: int
    launcher: Launcher
    policy: Restart
    env: dict[str, str]
    incarnation: int = 0
    handle: ProcHandle | None = None
    state: str = "starting"  # starting | rejoining | alive | restarting | stopping | dead | failed | stopped
    pid: int | None = None
    host: str = ""
    addr: str = ""
    last_hb: float = 0.0
    started_at: float = 0.0
    restarts_used: int = 0
    restart_at: float = 0.0
    stop_deadline: float = 0.0
    actors: list[tuple[dict, list[Any]]] = field(default_factory=list)
    ready: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    rejoin_pending: int = 0
    start_timeout: float = 60.0
    spawns_pending: int = 0  # actor __init__ calls in flight: heartbeats may pause (imports hold the GIL)
    down_at: float | None = None  # wall time of the injected fault or, failing that, the death; cleared when serving

    @property
    def ident(self) -> bytes:
        return f"{self.proc_id}#{self.incarnation}".encode()

    def actor_ids(self) -> tuple[str, ...]:
        return tuple(spec["actor_id"] for spec, _ in self.actors)


class Controller:
    _instance: "Controller | None" = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> "Controller":
        with cls._lock:
            if cls._instance is None or cls._instance._closed:
                cls._instance = Controller()
            return cls._instance

    @classmethod
    def current(cls) -> "Controller | None":
        return cls._instance

    def __init__(self) -> None:
        secret_hex = os.environ.get(SECRET_ENV)
        if not secret_hex:
            secret_hex = Authenticator.new_secret().hex()
            os.environ[SECRET_ENV] = secret_hex  # children and plugins read it from the environment
        self.job_id = os.environ.setdefault(JOB_ID_ENV, uuid.uuid4().hex[:12])
        self.auth = Authenticator(bytes.fromhex(secret_hex))
        self.sock = tune(zmq_context().socket(zmq.ROUTER))
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        port = os.environ.get(CONTROLLER_PORT_ENV)
        self.addr, self.chan = bind_channel(self.sock, self.auth, "controller", port=int(port) if port else None)
        self._reply_out: dict[bytes, Any] = {}  # proc ident -> session answering that proc's link
        self.hb_timeout = float(os.environ.get(HB_TIMEOUT_ENV, "1.5"))
        self.init_hb_timeout = max(self.hb_timeout, float(os.environ.get(INIT_HB_TIMEOUT_ENV, "30")))
        self.start_timeout = float(os.environ.get(START_TIMEOUT_ENV, "60"))
        self.procs: dict[str, ProcRecord] = {}
        self.by_ident: dict[bytes, ProcRecord] = {}
        self.kv = kv.LocalKV()
        self._kv_waiters: list[tuple[float | None, bytes, int, str]] = []
        self._spawn_waits: dict[int, tuple[ProcRecord, concurrent.futures.Future]] = {}
        self._req_ids = iter(range(1, 1 << 62))
        self._tasks: deque = deque()
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._plugin_env: dict[str, str] | None = None
        self._plugin_gen = -1
        self._closed = False
        self.client = Client(self.auth, identity="controller")
        set_client_factory(lambda: self.client)
        kv.set_backend(self.kv)
        self._thread = threading.Thread(target=self._run, name="rlmesh-supervisor", daemon=True)
        self._thread.start()
        atexit.register(self.shutdown)

    # ------------------------------------------------------------------ thread handoff
    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn`` on the supervisor thread (the only one that touches the socket and records)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._tasks.append((fn, fut))
        os.eventfd_write(self._efd, 1)
        return fut

    def plugin_env(self) -> dict[str, str]:
        """Env from the controller plugins; re-run after ``hooks.invalidate_controller_plugins()``."""
        gen = hooks.controller_plugins_generation()
        if self._plugin_env is None or self._plugin_gen != gen:
            self._plugin_env = hooks.run_controller_plugins(
                hooks.ControllerInfo(controller_addr=self.addr, pid=os.getpid(), host=socket.gethostname()))
            self._plugin_gen = gen
        return self._plugin_env

    # ------------------------------------------------------------------ procs
    def launch_procs(self, proc_mesh: str, n: int, launcher: Launcher, policy: Restart,
                     env: dict[str, str] | None = None, timeout: float | None = None) -> list[ProcRecord]:
        """Launch ``n`` procs and wait until all joined; if any fails or is late, none is left running.

        ``timeout`` (default ``RLMESH_START_TIMEOUT_S``, 60 s) bounds each proc's start
        (slow image pulls want more). A failed launch frees the mesh name for a retry.
        """
        if any(r.proc_mesh == proc_mesh for r in self.procs.values()):
            raise ValueError(f"a proc mesh named {proc_mesh!r} exists already; pass another name=")
        start_timeout = timeout or self.start_timeout
        base_env = {**self.plugin_env(), **(env or {})}
        recs = [ProcRecord(f"{proc_mesh}.{i}", proc_mesh, i, launcher, policy, base_env,
                           start_timeout=start_timeout) for i in range(n)]
        self.submit(lambda: [self._launch(r) for r in recs]).result()
        deadline = time.monotonic() + start_timeout
        try:
            for r in recs:
                try:
                    r.ready.result(max(0.1, deadline - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    raise ActorError(f"proc {r.proc_id} did not join within {start_timeout}s "
                                     f"(pass spawn_procs(timeout=...) or set {START_TIMEOUT_ENV})") from None
        except BaseException:
            self._abandon(recs)
            raise
        return recs

    def _abandon(self, recs: list[ProcRecord]) -> None:
        """Stop what a failed launch started and forget it, so the same name can be used again."""
        try:
            self.stop_procs([r.proc_id for r in recs], timeout=3)
        finally:
            def forget() -> None:
                for r in recs:
                    if r.handle is not None and r.handle.poll() is None:
                        r.handle.kill()
                    self.procs.pop(r.proc_id, None)
                    self.by_ident.pop(r.ident, None)

            if not self._closed:
                self.submit(forget).result()
            if recs:
                call_launchers((r.launcher for r in recs), "release", recs[0].proc_mesh)

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` ran (a new ``Controller.get()`` then starts a fresh one)."""
        return self._closed

    def _launch(self, r: ProcRecord) -> None:
        self.procs[r.proc_id] = r
        self.by_ident[r.ident] = r
        r.started_at = time.monotonic()
        env = {**r.env, SECRET_ENV: os.environ[SECRET_ENV], JOB_ID_ENV: self.job_id}
        try:
            r.handle = r.launcher.launch(LaunchRequest(self.addr, r.proc_id, r.proc_mesh, r.rank, r.incarnation, env,
                                                       restartable=r.policy.max_restarts != 0))
        except Exception as exc:
            logger.exception("launching %s failed", r.proc_id)
            r.state = "failed"
            if not r.ready.done():
                r.ready.set_exception(ActorError(f"could not launch proc {r.proc_id}: {exc}"))
            return
        r.pid = getattr(r.handle, "pid", None)

    def spawn_actors(self, placements: list[tuple[str, dict]], cls_payload: list[Any],
                     timeout: float | None = None) -> dict[str, tuple[str, int]]:
        """Create one actor per ``(proc_id, spec)``; returns ``{actor_id: (addr, incarnation)}``."""
        def start() -> list[tuple[ProcRecord, dict, concurrent.futures.Future]]:
            out = []
            for proc_id, spec in placements:
                rec = self.procs[proc_id]
                fut: concurrent.futures.Future = concurrent.futures.Future()
                if rec.state != "alive":
                    fut.set_exception(ActorDied(f"proc {proc_id} is {rec.state}", mesh=spec["mesh"],
                                                rank=spec["rank"], endpoint="__init__"))
                else:
                    self._send_spawn(rec, [spec], cls_payload, False, fut)
                out.append((rec, spec, fut))
            return out

        waits = self.submit(start).result()
        result: dict[str, tuple[str, int]] = {}
        errors: list[BaseException] = []
        for rec, spec, fut in waits:
            try:
                fut.result(timeout or self.start_timeout)
                result[spec["actor_id"]] = (rec.addr, rec.incarnation)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        self.submit(lambda: [self.procs[p].actors.append((s, cls_payload)) for p, s in placements]).result()
        self._preload(placements, cls_payload)
        return result

    def _preload(self, placements: list[tuple[str, dict]], cls_payload: list[Any]) -> None:
        """Tell launchers that keep warm templates (local fork server) which modules these actors need."""
        recs = [self.procs[p] for p, _ in placements if p in self.procs]
        restartable = [r for r in recs if r.policy.max_restarts != 0]
        if not restartable:
            return
        modules = modules_in_payload(cls_payload)
        if modules:
            for mesh in dict.fromkeys(r.proc_mesh for r in restartable):
                call_launchers((r.launcher for r in restartable if r.proc_mesh == mesh), "preload", mesh, modules)

    def _send_spawn(self, rec: ProcRecord, specs: list[dict], cls_payload: list[Any], restarted: bool,
                    fut: concurrent.futures.Future) -> None:
        req = next(self._req_ids)
        self._spawn_waits[req] = (rec, fut)
        rec.spawns_pending += 1
        fut._rlmesh_specs = specs  # type: ignore[attr-defined]  # for error messages
        self._send(rec, P.SPAWN, req=req, specs=specs, cls=cls_payload, restarted=restarted)

    def stop_procs(self, proc_ids: list[str], timeout: float = 5.0) -> None:
        def begin() -> None:
            for pid_ in proc_ids:
                r = self.procs.get(pid_)
                if r is None or r.state in ("dead", "failed", "stopped"):
                    continue
                if r.state == "restarting":  # between death and relaunch: just cancel the relaunch
                    r.state = "stopped"
                    continue
                r.state = "stopping"
                r.stop_deadline = time.monotonic() + timeout
                self._send(r, P.STOP)

        if self._closed:
            return
        self.submit(begin).result()
        end = time.monotonic() + timeout + 2
        while time.monotonic() < end:
            if all(self.procs[p].state in ("stopped", "failed", "dead") for p in proc_ids if p in self.procs):
                return
            time.sleep(0.02)

    def inject_fault(self, proc_id: str, kind: str) -> bool:
        """Fault injection: ``kill`` SIGKILLs the proc, ``hang`` freezes it (heartbeats stop, calls stall).

        Returns False when the proc was not alive (nothing injected). The event
        ``fault_injected`` (reason = kind) precedes the death the supervisor then sees.
        """
        if kind not in ("kill", "hang"):
            raise ValueError(f"fault kind {kind!r}: use 'kill' or 'hang'")

        def do() -> bool:
            rec = self.procs.get(proc_id)
            if rec is None or rec.state != "alive" or rec.handle is None:
                return False
            self._emit("fault_injected", rec, reason=kind)
            rec.down_at = time.time()  # recovery is timed from the fault, not from its detection
            if kind == "kill":
                rec.handle.kill()
            else:
                self._send(rec, P.HANG)
            return True

        return self.submit(do).result()

    # ------------------------------------------------------------------ supervisor loop
    def _send(self, rec: ProcRecord, kind: str, **fields: Any) -> None:
        out = self._reply_out.get(rec.ident)
        if out is None:  # it has not said hello yet: nothing can reach it
            logger.debug("control send to %s before its hello: dropped", rec.proc_id)
            return
        try:
            self.sock.send_multipart([rec.ident, *P.control(out, kind, **fields)], copy=False)
        except zmq.ZMQError as exc:  # not connected (yet / any more)
            logger.debug("control send to %s failed: %s", rec.proc_id, exc)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._efd, zmq.POLLIN)
        while not self._closed:
            try:
                events = dict(poller.poll(50))
            except zmq.ZMQError:
                if self._closed:
                    return
                raise
            if self._efd in events:
                try:
                    os.eventfd_read(self._efd)
                except BlockingIOError:
                    pass
            while self._tasks:
                fn, fut = self._tasks.popleft()
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - hand it to the waiting thread
                    fut.set_exception(exc)
            if self.sock in events:
                self._drain()
            try:
                self._tick()
            except Exception:
                logger.exception("supervisor tick failed")

    def _drain(self) -> None:
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            ident = bytes(frames[0])
            try:
                kind, msg, sid = P.read_control_session(self.chan, frames[1:])
            except AuthError:
                continue  # counted, and logged at most once per peer per interval, by the channel
            except Exception as exc:
                logger.warning("refused a control message from %r: %s", ident[:40], exc)
                continue
            rec = self.by_ident.get(ident)
            if rec is None:
                logger.warning("control message %s from unknown proc %r", kind, ident[:40])
                continue
            self._reply_out[ident] = self.chan.reply_outbound(sid)
            try:
                self._handle(rec, kind, msg)
            except Exception:
                logger.exception("handling %s from %s failed", kind, rec.proc_id)

    def _handle(self, rec: ProcRecord, kind: str, msg: dict) -> None:
        now = time.monotonic()
        if kind == P.HEARTBEAT:
            rec.last_hb = now
            self._send(rec, P.HB_ACK)  # the worker's proof that its controller is alive
        elif kind == P.HELLO:
            rec.last_hb = now
            rec.pid, rec.host, rec.addr = msg["pid"], msg["host"], msg["addr"]
            for other in self.procs.values():  # tell the newcomer where everyone is
                if other is not rec and other.state == "alive":
                    self._send(rec, P.PROC_UP, proc_id=other.proc_id, addr=other.addr,
                               incarnation=other.incarnation)
            self._emit("spawned", rec)
            if rec.incarnation == 0:
                self._mark_alive(rec)
                if not rec.ready.done():
                    rec.ready.set_result(rec)
            else:
                self._rejoin(rec)
        elif kind == P.SPAWNED:
            entry = self._spawn_waits.pop(msg["req"], None)
            if entry is None:
                return
            _, fut = entry
            rec.spawns_pending -= 1
            if msg["ok"]:
                fut.set_result(True)
            else:
                err, spec = msg["error"], fut._rlmesh_specs[0]
                fut.set_exception(ActorError(
                    f"{err['type'].rsplit('.', 1)[-1]} in __init__: {err['message']}", mesh=spec["mesh"],
                    rank=spec["rank"], endpoint="__init__", remote_type=err["type"],
                    remote_traceback=err["traceback"]))
        elif kind == P.KV_REQ:
            self._kv(rec.ident, msg)
        elif kind == P.BYE:
            rec.stop_deadline = min(rec.stop_deadline or now + 5, now + 5)

    def _mark_alive(self, rec: ProcRecord) -> None:
        rec.state = "alive"
        self.client.proc_up(rec.proc_id, rec.addr, rec.incarnation)
        self._broadcast(rec, P.PROC_UP, proc_id=rec.proc_id, addr=rec.addr, incarnation=rec.incarnation)

    def _rejoin(self, rec: ProcRecord) -> None:
        """A replacement proc joined: re-create its actors (``__init__`` then ``on_restart``)."""
        rec.state = "rejoining"
        rec.rejoin_pending = len(rec.actors)
        if not rec.actors:
            self._restarted(rec)
            return
        for spec, cls_payload in rec.actors:
            fut: concurrent.futures.Future = concurrent.futures.Future()
            fut.add_done_callback(lambda f, rec=rec, inc=rec.incarnation: self.submit(
                lambda: self._rejoined_one(rec, inc, f)))
            self._send_spawn(rec, [spec], cls_payload, True, fut)

    def _rejoined_one(self, rec: ProcRecord, inc: int, f: concurrent.futures.Future) -> None:
        if rec.incarnation != inc or rec.state != "rejoining":
            return
        exc = f.exception()
        if exc is not None:
            logger.error("re-creating actors on %s failed: %s", rec.proc_id, exc)
            if rec.handle is not None:
                rec.handle.kill()
            return  # the tick sees the exit and applies the restart policy again
        rec.rejoin_pending -= 1
        if rec.rejoin_pending == 0:
            self._restarted(rec)

    def _restarted(self, rec: ProcRecord) -> None:
        self._mark_alive(rec)
        took = None if rec.down_at is None else time.time() - rec.down_at
        rec.down_at = None
        self._emit("restarted", rec, recovery_s=took)

    def _broadcast(self, about: ProcRecord, kind: str, **fields: Any) -> None:
        for other in self.procs.values():
            if other is not about and other.state in ("alive", "rejoining", "starting"):
                self._send(other, kind, **fields)

    def _tick(self) -> None:
        now = time.monotonic()
        for rec in list(self.procs.values()):
            if rec.state in ("starting", "rejoining", "alive", "stopping") and rec.handle is not None:
                status = rec.handle.poll()
                if status is not None:
                    code, sig, why = (tuple(status) + ("",))[:3]
                    self._on_exit(rec, code, sig, reason="stopped" if rec.state == "stopping" else why)
                    continue
                if rec.state == "stopping" and now > rec.stop_deadline:
                    rec.handle.kill()
                elif rec.state in ("alive", "rejoining") and now - rec.last_hb > (
                        self.init_hb_timeout if rec.spawns_pending else self.hb_timeout):
                    rec.handle.kill()
                    limit = self.init_hb_timeout if rec.spawns_pending else self.hb_timeout
                    self._on_exit(rec, None, None, reason=f"heartbeat timeout ({limit}s without one)")
                elif rec.state == "starting" and now - rec.started_at > rec.start_timeout:
                    rec.handle.kill()
                    self._on_exit(rec, None, None, reason=f"did not join within {rec.start_timeout}s")
            elif rec.state == "restarting" and now >= rec.restart_at:
                self._relaunch(rec)
        if self._kv_waiters:
            self._kv_expire(now)

    def _on_exit(self, rec: ProcRecord, exit_code: int | None, sig: int | None, reason: str) -> None:
        stopping = rec.state == "stopping"
        rec.state = "stopped" if stopping else "dead"
        if not stopping and rec.down_at is None:
            rec.down_at = time.time()
        why = reason or ("clean exit" if exit_code == 0 else "")
        # The event goes out first, so a caller woken by ActorDied already finds the death recorded.
        self._emit("stopped" if stopping else "died", rec, exit_code=exit_code, signal=sig, reason=why)
        self.client.proc_down(rec.proc_id, rec.incarnation, exit_code, sig, why)
        self._broadcast(rec, P.PROC_DOWN, proc_id=rec.proc_id, incarnation=rec.incarnation,
                        exit_code=exit_code, signal=sig, reason=why)
        for req, (r, fut) in list(self._spawn_waits.items()):
            if r is rec:
                del self._spawn_waits[req]
                rec.spawns_pending = 0
                spec = fut._rlmesh_specs[0]
                fut.set_exception(Client._died(spec["mesh"], spec["rank"], "__init__", exit_code, sig, why))
        if not rec.ready.done():
            how = f"signal {sig}" if sig is not None else f"exit code {exit_code}" if exit_code is not None else why
            rec.ready.set_exception(ActorDied(
                f"proc {rec.proc_id} ended before it joined ({how}); its stderr above says why",
                mesh=rec.proc_mesh, rank=rec.rank, endpoint="(start)", exit_code=exit_code, signal=sig))
        if stopping:
            return
        if rec.policy.allows(rec.restarts_used):
            rec.restarts_used += 1
            rec.state = "restarting"
            rec.restart_at = time.monotonic() + rec.policy.backoff_s
        else:
            rec.state = "failed"
            if rec.policy.max_restarts:
                self._emit("gave_up", rec, exit_code=exit_code, signal=sig,
                           reason=f"max_restarts={rec.policy.max_restarts} exhausted")

    def _relaunch(self, rec: ProcRecord) -> None:
        self.by_ident.pop(rec.ident, None)
        rec.incarnation += 1
        rec.state = "starting"
        rec.addr = ""
        self._launch(rec)

    def _emit(self, kind: str, rec: ProcRecord, **kw: Any) -> None:
        hooks.emit_event(hooks.ProcEvent(kind=kind, proc_mesh=rec.proc_mesh, rank=rec.rank, proc_id=rec.proc_id,
                                         pid=rec.pid, host=rec.host, incarnation=rec.incarnation,
                                         actors=rec.actor_ids(), **kw))

    # ------------------------------------------------------------------ KV
    def _kv(self, ident: bytes, msg: dict) -> None:
        op, key, req = msg["op"], msg["key"], msg["req"]
        rec = self.by_ident[ident]
        if op == "put":
            self.kv.put(key, msg["value"])
            self._send(rec, P.KV_REP, req=req, ok=True)
            self._kv_wake(key)
        elif op == "delete":
            self.kv.delete(key)
            self._send(rec, P.KV_REP, req=req, ok=True)
        elif op == "keys":
            self._send(rec, P.KV_REP, req=req, ok=True, value=self.kv.keys(key))
        elif op == "get":
            try:
                self._send(rec, P.KV_REP, req=req, ok=True, value=self.kv.get_nowait(key))
            except KeyError:
                t = msg.get("timeout")
                deadline = None if t is None else time.monotonic() + t
                self._kv_waiters.append((deadline, ident, req, key))

    def _kv_wake(self, key: str) -> None:
        keep = []
        for w in self._kv_waiters:
            rec = self.by_ident.get(w[1])
            if w[3] == key and rec is not None:
                self._send(rec, P.KV_REP, req=w[2], ok=True, value=self.kv.get_nowait(key))
            else:
                keep.append(w)
        self._kv_waiters = keep

    def _kv_expire(self, now: float) -> None:
        for k in {w[3] for w in self._kv_waiters}:
            try:
                self.kv.get_nowait(k)
                self._kv_wake(k)  # put by the controller itself
            except KeyError:
                pass
        keep = []
        for w in self._kv_waiters:
            if w[0] is not None and w[0] <= now:
                rec = self.by_ident.get(w[1])
                if rec is not None:
                    self._send(rec, P.KV_REP, req=w[2], ok=False, error=f"kv key {w[3]!r} not present in time")
            else:
                keep.append(w)
        self._kv_waiters = keep

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        if self._closed:
            return
        live = [p for p, r in self.procs.items() if r.state not in ("dead", "failed", "stopped")]
        if live:
            try:
                self.stop_procs(live, timeout=3)
            except Exception:
                logger.exception("stopping procs at shutdown failed")
        self._closed = True
        os.eventfd_write(self._efd, 1)
        self._thread.join(timeout=2)
        for r in self.procs.values():
            if r.handle is not None and r.handle.poll() is None:
                r.handle.kill()
        call_launchers((r.launcher for r in self.procs.values()), "close")
        reset_client()
        self.client.close()
        self.sock.close(0)
