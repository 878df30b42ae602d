"""The controller's control plane: launches procs, supervises them, restarts them, serves the KV table.

One :class:`Controller` per controller process, created by the first
``spawn_procs``. Its supervisor thread owns the control ROUTER socket: workers
dial in (``HELLO``), heartbeat, answer spawn requests and use the KV table.
Every tick it checks each proc (:mod:`rlmesh.actor.supervision` says how a death is
decided: an exit seen by the launcher, a stopped local proc, or a heartbeat silence
longer than the host's observed delays allow). Then every future waiting on it
fails with ``ActorDied``, the other procs are told (so their own pending calls fail
too), an event goes to the sinks, and the :class:`Restart` policy (an intensity: N
restarts within T seconds) decides on a replacement, which gets its actors
re-created from their original constructor arguments. A death while a proc starts
or while its actors are being created is handled the same way: the spawn caller
waits for the replacement instead of failing.

The exit and restart path lives in :mod:`rlmesh.actor.recovery` (a mixin of :class:`Controller`),
the KV table's request handling in :mod:`rlmesh.actor.kv_service`.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable, Iterable

import zmq

from rlmesh import settings
from rlmesh.actor import hooks, kv
from rlmesh.actor import protocol as P
from rlmesh.actor.beats import BOARD_ENV, BOARD_EVERY, HeartbeatBoard
from rlmesh.actor.client import Client, reset_client, set_client_factory
from rlmesh.actor.context import JOB_ID_ENV
from rlmesh.actor.kv_service import KVService
from rlmesh.actor.recovery import RecoveryMixin
from rlmesh.actor.payload import modules_in_payload
from rlmesh.actor.proc_state import ENDED, ProcState
from rlmesh.actor.procs import Launcher, LaunchRequest, ProcHandle, ProcRecord, call_launchers  # noqa: F401
from rlmesh.actor.supervision import (  # noqa: F401 - re-export
    HB_ACK_EVERY_S, TICK_S, FailureDetection, HostGaps, Restart, heartbeat_interval, silent_death)
from rlmesh.errors import ActorDied, ActorError
from rlmesh.transport.auth import SECRET_ENV, AuthError, Authenticator
from rlmesh.transport.sockets import bind_channel, limit_messages, send_frames, tune, zmq_context

logger = logging.getLogger(__name__)

_POLLED = (ProcState.STARTING, ProcState.REJOINING, ProcState.ALIVE, ProcState.STOPPING)  # exits looked for each tick
_HEARTBEATING = (ProcState.ALIVE, ProcState.REJOINING)  # heartbeat silence judged
_SWEPT = frozenset({ProcState.ALIVE, *ENDED})  # looked at only when sweeping
_TOLD_OF_DEATHS = (ProcState.ALIVE, ProcState.REJOINING, ProcState.STARTING, ProcState.STOPPING)  # get PROC_DOWN
SWEEP_EVERY = BOARD_EVERY  # ticks between full sweeps (0.2 s): the board is read at the same cadence
OUTBOX_CHUNK = 128
"""Control messages sent per supervisor loop turn while a broadcast is queued. Telling 999 procs of a
death takes 20-30 ms on a 2-core host; sent in chunks, the loop reads messages and sees the next
exit between them, so a death that follows another is seen as soon as a lone one (1 ms after the
launcher's notice at 1,000 procs, against 21-32 ms in one piece: docs/performance.md)."""

CONTROLLER_PORT_ENV = settings.CONTROLLER_PORT.name  # a fixed port (behind a Kubernetes Service); default: any


class Controller(RecoveryMixin):
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
        # children and plugins read both from the environment
        secret_hex = settings.SECRET.setdefault(Authenticator.new_secret().hex())
        self.job_id = settings.JOB_ID.setdefault(uuid.uuid4().hex[:12])
        self.auth = Authenticator(bytes.fromhex(secret_hex))
        self.sock = limit_messages(tune(zmq_context().socket(zmq.ROUTER)))  # before any frame is buffered
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.addr, self.chan = bind_channel(self.sock, self.auth, "controller", port=settings.CONTROLLER_PORT.get())
        self._reply_out: dict[bytes, Any] = {}  # proc ident -> session answering that proc's link
        self.detection = FailureDetection.from_env()  # meshes whose Restart carries no detection= use this
        self._reaping: list[ProcHandle] = []  # killed procs not yet seen exit (waitpid'ed each tick: no zombies)
        self._last_tick = time.monotonic()
        self._ups: list[ProcRecord] = []  # procs now alive, announced to the others in one message per loop turn
        self._downs: list[tuple] = []  # deaths of this loop turn, told to the others in one message (P.PROC_DOWN)
        self._outbox: deque[tuple[bytes, str, P.Packed]] = deque()  # (ident, proc id, message), OUTBOX_CHUNK a turn
        self._hb_s = heartbeat_interval(0)  # the interval workers are told to heartbeat at (grows with N)
        # Procs on this host beat through shared memory (read every BOARD_EVERY ticks), not by message.
        self._board = HeartbeatBoard.create(self.job_id)
        self._ticks = 0
        # Live procs' handles are polled, and their silences judged, every SWEEP_EVERY ticks, or at the
        # next tick once a launcher reports an exit (notice_exit); procs starting, stopping or
        # restarting are looked at every tick. At 1,000 procs a full scan every 50 ms cost 2-3 % of a core.
        self._sweep_now = False
        self._host_gaps: dict[str, HostGaps] = {}  # host -> heartbeat gaps of its procs (the hang allowance)
        self.procs: dict[str, ProcRecord] = {}
        self.by_ident: dict[bytes, ProcRecord] = {}
        self._fenced: dict[bytes, float] = {}  # stale incarnations' idents -> when last told to exit
        self.kv = kv.LocalKV()
        self._kv_service = KVService(self.kv, self._kv_reply)
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

    def notice_exit(self) -> None:
        """A launcher saw one of its procs end (from any thread): poll every handle at once rather than
        at the next sweep, so a death is reported within a tick, not within SWEEP_EVERY ticks."""
        self._sweep_now = True
        os.eventfd_write(self._efd, 1)

    @classmethod
    def notice_exit_if_open(cls) -> None:
        """For launchers' exit callbacks (any thread): :meth:`notice_exit` on this process's controller,
        if one is open; an exit reported while none is (during or after shutdown) needs no sweep."""
        c = cls.current()
        if c is not None and not c.closed:
            c.notice_exit()

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
        """Launch ``n`` procs and wait until all joined; if any fails for good, none is left running.

        ``timeout`` (default: the policy's ``detection.start_timeout_s``, else
        ``RLMESH_START_TIMEOUT_S``, 120 s) bounds each proc's start (slow image pulls want
        more). A proc killed before it joined is restarted under ``policy`` like any other
        death. A failed launch frees the mesh name for a retry.
        """
        if any(r.proc_mesh == proc_mesh for r in self.procs.values()):
            raise ValueError(f"a proc mesh named {proc_mesh!r} exists already; pass another name=")
        detect = policy.detection or self.detection
        start_timeout = timeout or detect.start_timeout_s
        base_env = {**self.plugin_env(), **(env or {})}
        recs = [ProcRecord(f"{proc_mesh}.{i}", proc_mesh, i, launcher, policy, base_env, detect=detect,
                           start_timeout=start_timeout) for i in range(n)]
        self.submit(lambda: [self._launch(r) for r in recs]).result()  # type: ignore[func-returns-value]  # run for effect, on the supervisor thread
        try:
            for r in recs:  # every path ends the future: join, give-up, the start timeout (on the tick)
                while True:
                    try:
                        r.ready.result(1.0)
                        break
                    except concurrent.futures.TimeoutError:
                        if self._closed:
                            raise ActorError(f"the controller shut down while {r.proc_id} started") from None
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
                    if self._board is not None:
                        self._board.detach(r)

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
        env = {**r.env, SECRET_ENV: settings.SECRET.get(), JOB_ID_ENV: self.job_id}
        board = self._board.attach(r) if self._board is not None and getattr(r.launcher, "same_host", False) else None
        if board is not None:
            env[BOARD_ENV] = board
        try:
            r.handle = r.launcher.launch(LaunchRequest(self.addr, r.proc_id, r.proc_mesh, r.rank, r.incarnation, env,
                                                       restartable=r.policy.restartable))
        except Exception as exc:
            logger.exception("launching %s failed", r.proc_id)
            r.state = ProcState.FAILED
            if not r.ready.done():
                r.ready.set_exception(ActorError(f"could not launch proc {r.proc_id}: {exc}"))
            r.fail_waiters(f"could not launch it: {exc}")
            return
        r.pid = getattr(r.handle, "pid", None)

    def spawn_actors(self, placements: list[tuple[str, dict]], cls_payload: list[Any],
                     timeout: float | None = None) -> dict[str, tuple[str, int]]:
        """Create one actor per ``(proc_id, spec)``; returns ``{actor_id: (addr, incarnation)}``.

        Each spec joins its proc's actor list *before* its ``__init__`` is sent, so a proc
        that dies while creating it (or while starting) re-creates it in its replacement, and
        this call waits for that replacement, under the mesh's restart policy: spawning is
        recovered like any other moment of a run. An exception raised by ``__init__`` is
        raised here (and the specs are dropped again). ``timeout`` (default the policy's
        ``spawn_timeout_s``: none) bounds a construction whose proc stays alive.
        """
        def start() -> list[tuple[ProcRecord, dict, concurrent.futures.Future]]:
            out = []
            for proc_id, spec in placements:
                rec = self.procs[proc_id]
                fut: concurrent.futures.Future = concurrent.futures.Future()
                fut._rlmesh_specs = [spec]  # type: ignore[attr-defined]  # for error messages
                if rec.state in ("failed", "stopped", "stopping"):
                    fut.set_exception(ActorDied(f"proc {proc_id} is {rec.state}", mesh=spec["mesh"],
                                                rank=spec["rank"], endpoint="__init__"))
                else:
                    rec.actors.append((spec, cls_payload))
                    if rec.state == "alive":
                        self._send_spawn(rec, [spec], cls_payload, False, fut, first=True)
                    elif rec.state == "rejoining":  # its re-creations are under way: this one follows them
                        rec.deferred.append((spec, cls_payload, fut))
                    else:  # dead and about to be replaced: the replacement's rejoin creates it
                        rec.awaiting.append(fut)
                out.append((rec, spec, fut))
            return out

        waits = self.submit(start).result()
        limit = timeout if timeout is not None else (waits[0][0].detect.spawn_timeout_s if waits else None)
        deadline = None if limit is None else time.monotonic() + limit
        errors: list[BaseException] = []
        for rec, spec, fut in waits:
            try:
                fut.result(None if deadline is None else max(0.1, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                errors.append(ActorError(
                    f"{spec['mesh']}[{spec['rank']}].__init__ did not finish within {limit:g}s while its proc "
                    f"{rec.proc_id} lived (raise {rec.detect.key('spawn_timeout_s')}, or leave it unset: no limit)",
                    mesh=spec["mesh"], rank=spec["rank"], endpoint="__init__"))
            except Exception as exc:
                errors.append(exc)
        if errors:
            ids = {spec["actor_id"] for _, spec in placements}
            self.submit(lambda: [r.actors.__setitem__(slice(None), [a for a in r.actors if a[0]["actor_id"] not in ids])
                                 for r in {id(r): r for r, _, _ in waits}.values()]).result()
            raise errors[0]
        result = self.submit(lambda: {spec["actor_id"]: (self.procs[p].addr, self.procs[p].incarnation)
                                      for p, spec in placements}).result()
        self._preload(placements, cls_payload)
        return result

    def _preload(self, placements: list[tuple[str, dict]], cls_payload: list[Any]) -> None:
        """Tell launchers that keep warm templates (local fork server) which modules these actors need."""
        recs = [self.procs[p] for p, _ in placements if p in self.procs]
        restartable = [r for r in recs if r.policy.restartable]
        if not restartable:
            return
        modules = modules_in_payload(cls_payload)
        if modules:
            for mesh in dict.fromkeys(r.proc_mesh for r in restartable):
                call_launchers((r.launcher for r in restartable if r.proc_mesh == mesh), "preload", mesh, modules)

    def _send_spawn(self, rec: ProcRecord, specs: list[dict], cls_payload: list[Any], restarted: bool,
                    fut: concurrent.futures.Future, first: bool = False) -> None:
        """``first``: a first-time creation (``spawn_actors``): if the proc dies before it is done,
        the future waits for the replacement (which re-creates it) instead of failing."""
        req = next(self._req_ids)
        self._spawn_waits[req] = (rec, fut)
        rec.spawns_pending += 1
        fut._rlmesh_specs = specs  # type: ignore[attr-defined]  # for error messages
        fut._rlmesh_first = first  # type: ignore[attr-defined]
        self._send(rec, P.SPAWN, req=req, specs=specs, cls=cls_payload, restarted=restarted)

    def stop_procs(self, proc_ids: list[str], timeout: float = 5.0) -> None:
        def begin() -> None:
            for pid_ in proc_ids:
                r = self.procs.get(pid_)
                if r is None or r.state in (ProcState.DEAD, ProcState.FAILED, ProcState.STOPPED):
                    continue
                if r.state == ProcState.RESTARTING:  # between death and relaunch: just cancel the relaunch
                    r.state = ProcState.STOPPED
                    continue
                r.state = ProcState.STOPPING
                r.stop_deadline = time.monotonic() + timeout
                self._send(r, P.STOP)

        if self._closed:
            return
        self.submit(begin).result()
        end = time.monotonic() + timeout + 2
        while time.monotonic() < end:
            if all(self.procs[p].state in (ProcState.STOPPED, ProcState.FAILED, ProcState.DEAD) for p in proc_ids if p in self.procs):
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
            if rec is None or rec.state != ProcState.ALIVE or rec.handle is None:
                return False
            self._emit("fault_injected", rec, reason=kind)
            rec.down_at = time.time()  # recovery is timed from the fault, not from its detection
            if kind == "kill":
                rec.handle.kill()
            else:
                self._send(rec, P.HANG)
            return True

        return self.submit(do).result()

    def progressed(self, proc_ids: Iterable[str], what: str) -> None:
        """The program saw ``proc_ids`` make progress (``what``, in words: ``train step``, ``rollout
        landed``). A proc serving again after a fault that had made none since gets a ``recovered``
        event: ``recovery_s`` from the fault (or the death) to now, ``serving_s`` as its ``restarted``
        event had it. Serving is not enough for a run: a trainer that serves but cannot train stalls it.

        Cheap for procs not recovering (a dict lookup each, nothing queued): recipes call it after
        every train step and every rollout. Never blocks; the event's time is this call's."""
        at = time.time()
        ids = [p for p in proc_ids if (r := self.procs.get(p)) is not None and r.recovering is not None]
        if ids:
            self.submit(lambda: self._progressed(ids, what, at))

    def restart_proc(self, proc_id: str, reason: str, starting: bool = False) -> bool:
        """Kill an alive proc on purpose so its mesh's restart policy replaces it (actors re-created,
        ``on_restart`` run): new code after a workspace sync. Event ``restart_requested`` (reason) first;
        it counts against the restart budget like any death. False when the proc was not alive.

        ``starting``: a proc still starting or re-creating its actors is killed too (a trainer mesh
        restarts every rank when one dies: :mod:`rlmesh.rl.train.recovery`). Called on the supervisor
        thread (from an event sink), it acts at once instead of waiting for that thread."""
        states = (ProcState.ALIVE, ProcState.STARTING, ProcState.REJOINING) if starting else (ProcState.ALIVE,)

        def do() -> bool:
            rec = self.procs.get(proc_id)
            if rec is None or rec.state not in states or rec.handle is None or not rec.policy.restartable:
                return False
            self._emit("restart_requested", rec, reason=reason)
            rec.down_at = time.time()
            rec.handle.kill()
            return True

        if threading.current_thread() is self._thread:
            return do()
        return self.submit(do).result()

    # ------------------------------------------------------------------ supervisor loop
    def _send(self, rec: ProcRecord, kind: str, **fields: Any) -> None:
        self._send_packed(rec, P.pack_control(kind, **fields))

    def _send_packed(self, rec: ProcRecord, packed: P.Packed) -> None:
        if self._outbox:  # behind a broadcast still being sent: each proc gets its messages in order
            self._outbox.append((rec.ident, rec.proc_id, packed))
        else:
            self._send_now(rec.ident, rec.proc_id, packed)

    def _send_now(self, ident: bytes, proc_id: str, packed: P.Packed) -> None:
        out = self._reply_out.get(ident)
        if out is None:  # it has not said hello yet (or this incarnation is gone): nothing can reach it
            logger.debug("control send to %s before its hello: dropped", proc_id)
            return
        body, extra = packed
        try:
            send_frames(self.sock, [ident, *out.sign_packed(body, extra)])
        except zmq.ZMQError as exc:  # not connected (yet / any more)
            logger.debug("control send to %s failed: %s", proc_id, exc)

    def _flush_outbox(self, budget: int = OUTBOX_CHUNK) -> None:
        box = self._outbox
        for _ in range(min(budget, len(box))):
            self._send_now(*box.popleft())

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._efd, zmq.POLLIN)
        # The tick (a scan of every proc) runs every TICK_S, not after every message: woken by
        # each of N procs' heartbeats, a per-wake scan costs O(N^2) per heartbeat interval.
        next_tick = 0.0
        while not self._closed:
            wait = 0 if self._outbox else max(0, int((next_tick - time.monotonic()) * 1000) + 1)
            try:
                events = dict(poller.poll(wait))
            except zmq.ZMQError:
                if self._closed:
                    return
                raise
            ran = False
            if self._efd in events:
                try:
                    os.eventfd_read(self._efd)
                except BlockingIOError:
                    pass
            while self._tasks:
                fn, fut = self._tasks.popleft()
                ran = True
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - hand it to the waiting thread
                    fut.set_exception(exc)
            backlog = self._drain() if self.sock in events else False
            now = time.monotonic()
            if ran or self._sweep_now or now >= next_tick:  # a launcher saw an exit (notice_exit): look now
                next_tick = now + TICK_S
                try:
                    self._tick(backlog)
                except Exception:
                    logger.exception("supervisor tick failed")
            if self._ups:
                self._announce_ups()
            if self._downs:
                self._announce_downs()
            if self._outbox:
                self._flush_outbox()

    def _drain(self) -> bool:  # type: ignore[return]  # the loop (itertools.count) only ends by return
        """Handle the queued control messages, for at most TICK_S: when more arrive than this thread
        can read (thousands of procs on a saturated host), the tick still runs, so exits are still seen
        at once; what is left is read on the next loop turn. True when messages were left unread
        (their heartbeats too: no silence is judged until the backlog is read)."""
        until = time.monotonic() + TICK_S
        for n in itertools.count(1):
            if not n % 64 and time.monotonic() > until:
                return True
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
            ident = bytes(frames[0])  # type: ignore[call-overload]  # a zmq Frame is a buffer
            try:
                kind, msg, sid = P.read_control_session(self.chan, frames[1:])
            except AuthError:
                continue  # counted, and logged at most once per peer per interval, by the channel
            except Exception as exc:
                logger.warning("refused a control message from %r: %s", ident[:40], exc)
                continue
            rec = self.by_ident.get(ident)
            if rec is None:
                if not self._fence(ident, sid):
                    logger.warning("control message %s from unknown proc %r", kind, ident[:40])
                continue
            self._reply_out[ident] = self.chan.reply_outbound(sid)
            try:
                self._handle(rec, kind, msg)
            except Exception:
                logger.exception("handling %s from %s failed", kind, rec.proc_id)

    def _fence(self, ident: bytes, sid: bytes) -> bool:
        """A message from a replaced incarnation of a proc (``proc_id#N`` below the current one): tell it
        to exit, at most once a second, and record it. True when ``ident`` was one.

        Why: a host cut off from the network is declared dead by its silence and its procs replaced,
        but the procs themselves live on, out of reach (their kill is lost too). When the link comes
        back, the old incarnation dials in again: it must not become a second live copy of the proc
        (serving calls, writing checkpoints), so its messages are refused, as any unknown ident's are,
        and it is told to exit without running anything."""
        proc_id, _, inc = ident.decode(errors="replace").rpartition("#")
        rec = self.procs.get(proc_id)
        if rec is None or not inc.isdigit() or int(inc) >= rec.incarnation:
            return False
        now = time.monotonic()
        if now - self._fenced.get(ident, -1e9) < 1.0:
            return True
        first = ident not in self._fenced
        self._fenced[ident] = now
        body, extra = P.pack_control(P.FENCED, incarnation=rec.incarnation)
        try:
            send_frames(self.sock, [ident, *self.chan.reply_outbound(sid).sign_packed(body, extra)])
        except zmq.ZMQError as exc:
            logger.debug("fencing %s failed: %s", ident, exc)
        if first:
            logger.warning("%s incarnation %s came back after its replacement (%s): fenced, told to exit",
                           proc_id, inc, rec.incarnation)
            hooks.emit_event(hooks.ProcEvent(kind="fenced", proc_mesh=rec.proc_mesh, rank=rec.rank, proc_id=proc_id,
                                             pid=None, host="", incarnation=int(inc), actors=rec.actor_ids(),
                                             reason=f"replaced by incarnation {rec.incarnation}"))
        return True

    def _handle(self, rec: ProcRecord, kind: str, msg: dict) -> None:
        now = time.monotonic()
        if kind == P.HEARTBEAT:
            rec.last_hb = now
            if rec.spawns_pending:  # gaps while an __init__ holds the GIL have their own allowance
                rec.hb.restart(now)
            else:
                rec.hb.beat(now)
            if now - rec.last_ack >= HB_ACK_EVERY_S:  # the worker's proof that its controller lives (it
                rec.last_ack = now  # waits 10 s for one), and the heartbeat interval it should use
                self._send(rec, P.HB_ACK, hb_s=self._hb_s)
        elif kind == P.HELLO:
            rec.last_hb = now
            rec.hb.restart(now)
            rec.joined = True
            rec.pid, rec.host, rec.addr = msg["pid"], msg["host"], msg["addr"]
            rec.hb.host = self._host_gaps.setdefault(rec.host, HostGaps())
            self._hb_s = heartbeat_interval(len(self.procs) - (len(self._board.procs) if self._board else 0))
            rec.last_ack = now
            self._send(rec, P.HB_ACK, hb_s=self._hb_s)
            # Tell the newcomer where the replaced procs are now, in one message. A first incarnation is
            # where its actor handles say (they carry its address): listing every proc to every newcomer
            # was O(N^2) messages for N joins.
            ups = [(o.proc_id, o.addr, o.incarnation) for o in self.procs.values()
                   if o is not rec and o.state == ProcState.ALIVE and o.incarnation > 0]
            if ups:
                self._send(rec, P.DIRECTORY, up=ups)
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
                err, spec = msg["error"], fut._rlmesh_specs[0]  # type: ignore[attr-defined]  # set by spawn_actors, for messages
                fut.set_exception(ActorError(
                    f"{err['type'].rsplit('.', 1)[-1]} in __init__: {err['message']}", mesh=spec["mesh"],
                    rank=spec["rank"], endpoint="__init__", remote_type=err["type"],
                    remote_traceback=err["traceback"]))
        elif kind == P.KV_REQ:
            self._kv_service.handle(rec.ident, msg)
        elif kind == P.BYE:
            rec.stop_deadline = min(rec.stop_deadline or now + 5, now + 5)

    def _mark_alive(self, rec: ProcRecord) -> None:
        rec.state = ProcState.ALIVE
        self.client.proc_up(rec.proc_id, rec.addr, rec.incarnation)
        if rec.incarnation > 0:  # a replacement: the others learn its new address at the end of this loop turn
            if self._downs:
                self._announce_downs()  # a death still queued must not arrive after this up
            self._ups.append(rec)

    def _announce_ups(self) -> None:
        """One DIRECTORY message per live proc listing the procs that came up since the last one."""
        ups, self._ups = self._ups, []
        alive = {r.proc_id: r for r in ups if r.state == ProcState.ALIVE}
        if not alive:
            return
        everyone = P.pack_control(P.DIRECTORY, up=[(r.proc_id, r.addr, r.incarnation) for r in alive.values()])
        for other in self.procs.values():
            if other.state in (ProcState.ALIVE, ProcState.REJOINING, ProcState.STARTING):
                if other.proc_id not in alive:  # the same list for all but the newcomers: pickled once
                    self._send_packed(other, everyone)
                    continue
                mine = [(r.proc_id, r.addr, r.incarnation) for r in alive.values() if r is not other]
                if mine:
                    self._send(other, P.DIRECTORY, up=mine)

    def _kill(self, rec: ProcRecord) -> None:
        """SIGKILL (or delete) the proc and keep polling its handle until the exit is collected (no zombies)."""
        if rec.handle is not None:
            rec.handle.kill()
            self._reaping.append(rec.handle)

    def _announce_downs(self) -> None:
        """Tell every proc that is up, or still stopping, of the deaths queued this turn, in one message.
        A stopping proc is told too: it may be blocked in a call to a dead proc (procs stopped
        together), and that call must fail now, not hold its stop until the deadline kills it."""
        downs, self._downs = self._downs, []
        packed = P.pack_control(P.PROC_DOWN, down=downs)  # pickled once; signed per proc (each has its own key)
        dead = {d[0] for d in downs}  # a dead proc's replacement is not told of its predecessor
        self._outbox.extend((other.ident, other.proc_id, packed) for other in self.procs.values()
                            if other.state in _TOLD_OF_DEATHS and other.proc_id not in dead)

    def _tick(self, backlog: bool = False) -> None:
        now = time.monotonic()
        # This thread itself was starved (a busy host), or left messages unread: heartbeats may still sit
        # unread; judge silences next tick.
        stalled = backlog or now - self._last_tick > 0.5
        self._last_tick = now
        self._ticks += 1
        sweep = not self._ticks % SWEEP_EVERY
        if self._sweep_now:  # cleared only when seen (a launcher's thread may set it at any moment), and
            self._sweep_now = False  # before polling: an exit reported during this scan asks for another
            sweep = True
        if sweep and self._board is not None and self._board.procs:
            self._board.collect(_HEARTBEATING)
        for rec in list(self.procs.values()):  # exits, stop deadlines, start timeouts, relaunches: cheap per proc
            st = rec.state
            if st in _SWEPT and not sweep:
                continue
            if st in _POLLED and rec.handle is not None:
                if rec.pid is None and st == ProcState.STARTING:  # forked from a template: its pid arrives later
                    rec.pid = getattr(rec.handle, "pid", None)
                status = rec.handle.poll()
                if status is not None:
                    code, sig, why = (tuple(status) + ("",))[:3]
                    self._on_exit(rec, code, sig, reason="stopped" if st == ProcState.STOPPING else why)  # type: ignore[arg-type]  # poll(): (exit code, signal[, reason])
                elif st == ProcState.STOPPING and now > rec.stop_deadline:
                    rec.handle.kill()
                elif st == ProcState.STARTING and now - rec.started_at > rec.start_timeout and not stalled:
                    self._kill(rec)
                    self._on_exit(rec, None, None, reason=f"did not join within {float(rec.start_timeout)}s "
                                                          f"({rec.detect.key('start_timeout_s')})")
            elif st == ProcState.RESTARTING and now >= rec.restart_at:
                self._relaunch(rec)
        # Heartbeat silence: only procs silent past their floor are judged. If several are, the cause is
        # likely shared (this process starved), which silent_death allows for.
        silent = [r for r in self.procs.values() if r.state in _HEARTBEATING and r.handle is not None
                  and now - r.last_hb > r.detect.heartbeat_timeout_s] if sweep else ()
        if silent and not stalled:
            for rec in silent:
                why = silent_death(rec, now, len(silent))
                if why is not None:
                    kill_hung = getattr(rec.handle, "kill_hung", None)  # a capturing launcher takes its stacks first
                    if kill_hung is not None:  # it dumps the stacks, then kills (within ~1 s); we reap
                        kill_hung()
                        self._reaping.append(rec.handle)  # type: ignore[arg-type]  # not None: silent holds procs with a handle
                    else:
                        self._kill(rec)
                    self._on_exit(rec, None, None, reason=why)
        if self._reaping:
            self._reaping = [h for h in self._reaping if h.poll() is None]
        if self._kv_service:
            self._kv_service.expire(now)

    def _emit(self, kind: str, rec: ProcRecord, **kw: Any) -> None:
        hooks.emit_event(hooks.ProcEvent(kind=kind, proc_mesh=rec.proc_mesh, rank=rec.rank, proc_id=rec.proc_id,
                                         pid=rec.pid, host=rec.host, incarnation=rec.incarnation,
                                         actors=rec.actor_ids(), **kw))

    def _kv_reply(self, ident: bytes, req: int, ok: bool, **fields: Any) -> None:
        rec = self.by_ident.get(ident)
        if rec is not None:
            self._send(rec, P.KV_REP, req=req, ok=ok, **fields)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        if self._closed:
            return
        live = [p for p, r in self.procs.items() if r.state not in (ProcState.DEAD, ProcState.FAILED, ProcState.STOPPED)]
        if live:
            try:
                self.stop_procs(live, timeout=3)
            except Exception:
                logger.exception("stopping procs at shutdown failed")
        self._closed = True
        os.eventfd_write(self._efd, 1)
        self._thread.join(timeout=2)
        if self._board is not None:
            self._board.close()
        for r in self.procs.values():
            if r.handle is not None and r.handle.poll() is None:
                r.handle.kill()
        call_launchers((r.launcher for r in self.procs.values()), "close")
        reset_client()
        self.client.close()
        self.sock.close(0)
