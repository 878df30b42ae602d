"""The caller side of the data plane: one IO thread per process sends calls and completes futures.

Why one thread: zmq sockets are not thread-safe, and callers live on many threads
(the user's script, asyncio loops, actor threads). Callers pickle their own
arguments (so an unpicklable argument fails right there, naming its type), queue
the frames and poke an eventfd; the IO thread owns one DEALER per destination
proc, sends, receives replies and completes futures. Calls go straight to the
proc hosting the actor: a handle passed to another actor is used from that
actor's proc, never relayed through the controller.

Death handling: the runtime tells the client when a proc incarnation dies
(:meth:`Client.proc_down`); every pending call to it fails with ``ActorDied`` at
once, and new calls fail fast until a replacement is announced (:meth:`proc_up`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import pickle
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq

from rlmesh.actor import protocol as P
from rlmesh.actor.future import Future
from rlmesh.errors import ActorDied, ActorError, CallTimeout
from rlmesh.transport.auth import AuthError, Authenticator, is_loopback_address
from rlmesh.transport.serialization import dumps, loads
from rlmesh.transport.sockets import tune, zmq_context

logger = logging.getLogger(__name__)


@dataclass
class ProcEntry:
    """Where a proc's actors are served, and whether that incarnation is alive."""

    addr: str
    incarnation: int
    alive: bool = True
    death: tuple[int | None, int | None, str] | None = None  # exit_code, signal, reason


@dataclass
class _Call:
    fut: Future
    proc_id: str
    incarnation: int
    mesh: str
    rank: int
    endpoint: str
    actor_id: str
    deadline: float | None
    timeout: float | None = None


def error_payload(exc: BaseException, tb: str | None = None) -> list[Any]:
    """Frames describing a remote exception; the exception object travels only if it pickles."""
    info: dict[str, Any] = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": tb if tb is not None else "".join(traceback.format_exception(exc)),
    }
    try:
        info["pickled"] = pickle.dumps(exc, protocol=5)
    except Exception:
        pass
    return dumps(info)


def error_from_payload(frames: list[Any], mesh: str, rank: int, endpoint: str) -> ActorError:
    info = loads(frames)
    original = None
    if "pickled" in info:
        try:
            original = pickle.loads(info["pickled"])
        except Exception:
            original = None
    if isinstance(original, ActorError):
        # An actor re-raised an ActorError from a call it made: keep the innermost story.
        return original
    short = info["type"].rsplit(".", 1)[-1]
    return ActorError(
        f"{short}: {info['message']}", mesh=mesh, rank=rank, endpoint=endpoint,
        remote_type=info["type"], remote_traceback=info["traceback"], exception=original,
    )


class Client:
    """Per-process caller: directory of procs, pending calls, and the IO thread."""

    def __init__(self, auth: Authenticator, identity: str):
        self.auth = auth
        self.identity = identity
        self.directory: dict[str, ProcEntry] = {}
        self._pending: dict[int, _Call] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._outq: deque = deque()
        self._timeouts: list[tuple[float, int]] = []
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._socks: dict[str, zmq.Socket] = {}
        self._addr_of: dict[zmq.Socket, str] = {}
        self._auth_full: dict[str, Authenticator] = {}
        self.bytes_sent = 0
        self.bytes_received = 0
        self.calls_sent = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rlmesh-client-io", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ directory
    def proc_up(self, proc_id: str, addr: str, incarnation: int) -> None:
        with self._lock:
            cur = self.directory.get(proc_id)
            if cur is None or incarnation >= cur.incarnation:
                self.directory[proc_id] = ProcEntry(addr, incarnation, True)

    def proc_down(self, proc_id: str, incarnation: int, exit_code: int | None = None,
                  signal: int | None = None, reason: str = "") -> None:
        """Mark ``proc_id`` (up to ``incarnation``) dead and fail every call pending on it."""
        with self._lock:
            cur = self.directory.get(proc_id)
            if cur is not None and cur.incarnation <= incarnation:
                cur.alive = False
                cur.death = (exit_code, signal, reason)
            elif cur is None:
                self.directory[proc_id] = ProcEntry("", incarnation, False, (exit_code, signal, reason))
            doomed = [cid for cid, c in self._pending.items()
                      if c.proc_id == proc_id and c.incarnation <= incarnation]
            calls = [self._pending.pop(cid) for cid in doomed]
        for c in calls:
            c.fut._set_exception(self._died(c.mesh, c.rank, c.endpoint, exit_code, signal, reason))

    @staticmethod
    def _died(mesh: str, rank: int, endpoint: str, exit_code: int | None, signal: int | None,
              reason: str) -> ActorDied:
        how = []
        if signal is not None:
            how.append(f"killed by signal {signal}")
        if exit_code is not None:
            how.append(f"exit code {exit_code}")
        if reason:
            how.append(reason)
        return ActorDied(
            f"the proc hosting this actor died ({', '.join(how) or 'unknown cause'})",
            mesh=mesh, rank=rank, endpoint=endpoint, exit_code=exit_code, signal=signal,
        )

    # ------------------------------------------------------------------ calls
    def call(self, proc_id: str, addr_hint: str, inc_hint: int, actor_id: str, mesh: str, rank: int,
             endpoint: str, args: tuple, kwargs: dict, want_reply: bool = True,
             timeout: float | None = None, payload: list[Any] | None = None) -> Future | None:
        """Send one call; returns its future (``None`` for fire-and-forget). Pickling errors raise here."""
        if payload is None:
            payload = dumps((args, kwargs))
        with self._lock:
            entry = self.directory.get(proc_id)
            if entry is None:
                entry = self.directory[proc_id] = ProcEntry(addr_hint, inc_hint, True)
            if not entry.alive:
                exc = self._died(mesh, rank, endpoint, *(entry.death or (None, None, "")))
                if not want_reply:
                    logger.warning("broadcast to %s[%d].%s dropped: %s", mesh, rank, endpoint, exc.message)
                    return None
                fut: Future = Future()
                fut._set_exception(exc)
                return fut
            call_id = next(self._ids)
            fut = None
            if want_reply:
                fut = Future()
                deadline = None if timeout is None else time.monotonic() + timeout
                self._pending[call_id] = _Call(fut, proc_id, entry.incarnation, mesh, rank, endpoint,
                                               actor_id, deadline, timeout)
            meta = (P.CALL if want_reply else P.CAST, call_id, actor_id, endpoint, self.identity)
            self._outq.append((entry.addr, meta, payload, call_id, timeout))
        os.eventfd_write(self._efd, 1)
        return fut

    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    def outstanding(self, actor_id: str) -> int:
        with self._lock:
            return sum(1 for c in self._pending.values() if c.actor_id == actor_id)

    # ------------------------------------------------------------------ IO thread
    def _auth_for(self, addr: str) -> Authenticator:
        a = self._auth_full.get(addr)
        if a is None:
            a = self.auth if is_loopback_address(addr) else Authenticator(self.auth._key, full=True)
            self._auth_full[addr] = a
        return a

    def _sock(self, addr: str, poller: zmq.Poller) -> zmq.Socket:
        s = self._socks.get(addr)
        if s is None:
            s = tune(zmq_context().socket(zmq.DEALER))
            s.connect(addr)
            self._socks[addr] = s
            self._addr_of[s] = addr
            poller.register(s, zmq.POLLIN)
        return s

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._efd, zmq.POLLIN)
        while not self._closed:
            timeout_ms = 200
            if self._timeouts:
                timeout_ms = max(0, min(timeout_ms, int((self._timeouts[0][0] - time.monotonic()) * 1000) + 1))
            try:
                events = poller.poll(timeout_ms)
            except zmq.ZMQError:
                if self._closed:
                    return
                raise
            for sock, _ in events:
                if sock == self._efd:
                    try:
                        os.eventfd_read(self._efd)
                    except BlockingIOError:
                        pass
                else:
                    self._drain(sock)
            self._flush(poller)
            if self._timeouts:
                self._expire()

    def _flush(self, poller: zmq.Poller) -> None:
        while True:
            try:
                addr, meta, payload, call_id, timeout = self._outq.popleft()
            except IndexError:
                return
            frames = P.encode(self._auth_for(addr), meta, payload)
            try:
                self._sock(addr, poller).send_multipart(frames, copy=False)
            except zmq.ZMQError as exc:
                self._fail(call_id, ActorError(f"send to {addr} failed: {exc}"))
                continue
            self.calls_sent += 1
            self.bytes_sent += sum(memoryview(getattr(f, "buffer", f)).nbytes for f in frames)
            if timeout is not None:
                heapq.heappush(self._timeouts, (time.monotonic() + timeout, call_id))

    def _drain(self, sock: zmq.Socket) -> None:
        addr = self._addr_of.get(sock, "")
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.bytes_received += sum(len(f) for f in frames)
            try:
                (call_id, status), payload = P.decode_meta(self._auth_for(addr), frames)
            except (AuthError, Exception) as exc:
                logger.warning("dropped a reply from %s: %s", addr, exc)
                continue
            with self._lock:
                c = self._pending.pop(call_id, None)
            if c is None:
                continue  # timed out or failed already
            try:
                if status == P.OK:
                    c.fut._set_result(loads(payload))
                else:
                    c.fut._set_exception(error_from_payload(payload, c.mesh, c.rank, c.endpoint))
            except Exception as exc:  # e.g. the result's class is not importable here
                c.fut._set_exception(ActorError(
                    f"could not decode the result in the caller: {exc}", mesh=c.mesh, rank=c.rank,
                    endpoint=c.endpoint))

    def _fail(self, call_id: int, exc: BaseException) -> None:
        with self._lock:
            c = self._pending.pop(call_id, None)
        if c is not None:
            c.fut._set_exception(exc)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._timeouts and self._timeouts[0][0] <= now:
            _, call_id = heapq.heappop(self._timeouts)
            with self._lock:
                c = self._pending.get(call_id)
            if c is not None and c.deadline is not None and c.deadline <= now:
                self._fail(call_id, CallTimeout(
                    f"no reply within the call's {c.timeout}s timeout (set by .options(timeout=...))",
                    mesh=c.mesh, rank=c.rank, endpoint=c.endpoint))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.eventfd_write(self._efd, 1)
        self._thread.join(timeout=2)
        for s in self._socks.values():
            s.close(0)
        self._socks.clear()
        with self._lock:
            calls = list(self._pending.values())
            self._pending.clear()
        for c in calls:
            c.fut._set_exception(ActorError("the runtime shut down before a reply came", mesh=c.mesh,
                                            rank=c.rank, endpoint=c.endpoint))
        try:
            os.close(self._efd)
        except OSError:
            pass


_client: Client | None = None
_client_lock = threading.Lock()
_client_factory: Any = None


def set_client_factory(factory: Any) -> None:
    """Installed by the controller or worker bootstrap: builds this process's :class:`Client` on first use."""
    global _client_factory
    _client_factory = factory


def get_client() -> Client:
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                if _client_factory is None:
                    raise RuntimeError(
                        "no rlmesh runtime in this process: spawn procs first "
                        "(rm.this_host().spawn_procs(...)) or call from inside an actor")
                _client = _client_factory()
    return _client


def existing_client() -> Client | None:
    return _client


def reset_client() -> None:
    global _client
    with _client_lock:
        if _client is not None:
            _client.close()
        _client = None
