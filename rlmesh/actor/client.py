"""The caller side of the data plane: one IO thread per process sends calls and completes futures.

Why this shape: zmq sockets are not thread-safe and callers live on many
threads (the user's script, asyncio loops, actor threads), yet a thread handoff
costs tens of microseconds. So each calling thread pickles its own arguments (an
unpicklable argument fails right there, naming its type) and sends on its own
DEALER per destination proc, with no handoff. Replies do not come back on those
sockets: they go to this process's *inbox*, a ROUTER read by whichever thread is
waiting: a thread blocked in ``Future.get()`` reads the inbox itself
(leader/follower, guarded by a lock and woken through the socket's file
descriptor), so a blocking call costs no thread handoff at all; when nobody is
blocked, the IO thread reads it and completes futures for ``await`` and
callbacks. The IO thread also fires call timeouts. Calls go straight to the proc
hosting the actor: a handle passed to another actor is used from that actor's
proc, never relayed through the controller.

Death handling: the runtime tells the client when a proc incarnation dies
(:meth:`Client.proc_down`); every pending call to it fails with ``ActorDied`` at
once, and new calls fail fast until a replacement is announced (:meth:`proc_up`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import threading
import time
import traceback
from asyncio import AbstractEventLoop, _get_running_loop
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq

from rlmesh.actor import protocol as P
from rlmesh.actor.future import Future, flush_wakes, hold_wakes, release_wakes
from rlmesh.errors import ActorDied, ActorError, CallTimeout
from rlmesh.transport.auth import AuthError, Authenticator
from rlmesh.transport.channel import Outbound
from rlmesh.transport.serialization import dumps, loads, nbytes
from rlmesh.transport.sockets import (MessageTooLarge, bind_channel, check_message_size, connect_channel, has_message,
                                      limit_messages, max_message_bytes, poll_ms, recv_frames, send_frames, tune,
                                      wait_readable, zmq_context)

logger = logging.getLogger(__name__)


@dataclass
class ProcEntry:
    """Where a proc's actors are served, and whether that incarnation is alive."""

    addr: str
    incarnation: int
    alive: bool = True
    death: tuple[int | None, int | None, str] | None = None  # exit_code, signal, reason


class _Call(Future):
    """A pending call: its future, and what the client needs to fail or time it out. One object, not a
    future plus a record: a pipelined burst keeps thousands alive, each walked by the garbage collector."""

    __slots__ = ("proc_id", "incarnation", "mesh", "rank", "endpoint", "actor_id", "deadline", "timeout")

    def __init__(self, driver: "Client", proc_id: str, incarnation: int, mesh: str, rank: int, endpoint: str,
                 actor_id: str, deadline: float | None, timeout: float | None):
        # Future.__init__'s slots, set here: one Python call fewer on every call made
        self._done = False
        self._value = self._exc = self._callbacks = self._event = None
        self._driver = driver
        self.proc_id = proc_id
        self.incarnation = incarnation
        self.mesh = mesh
        self.rank = rank
        self.endpoint = endpoint
        self.actor_id = actor_id
        self.deadline = deadline
        self.timeout = timeout


def error_payload(exc: BaseException, tb: str | None = None) -> list[Any]:
    """Frames describing a remote exception; the exception object travels only if it pickles."""
    info: dict[str, Any] = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": tb if tb is not None else "".join(traceback.format_exception(exc)),
    }
    try:
        frames = dumps(exc)  # rlmesh's pickler: exceptions whose __init__ takes other args come back too
        if len(frames) == 1:
            info["pickled"] = bytes(frames[0])
    except Exception:
        pass
    return dumps(info)


def error_from_payload(frames: list[Any], mesh: str, rank: int, endpoint: str) -> ActorError:
    info = loads(frames)
    original = None
    if "pickled" in info:
        try:
            original = loads([info["pickled"]])
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


class ThreadSockets:
    """One thread's DEALER sockets, one per destination, each with its own signing session.

    A session's counter must reach the receiver in order, so it is signed and sent by
    one thread on one socket. Closed when the thread ends (its locals die), and a socket to a proc
    that died is closed at this thread's next send: zmq retries a dead address forever, so a
    controller that outlives many procs (restarts, meshes stopped) would otherwise spend a core
    reconnecting to them (1,320 dead addresses: 16 % of a core in libzmq's I/O thread).
    """

    def __init__(self, auth: Authenticator, lock: threading.Lock, registry: list, dead: "DeadAddresses | None" = None):
        self.socks: dict[str, tuple[zmq.Socket, Outbound]] = {}
        self._auth = auth
        self._lock = lock
        self._registry = registry
        self._dead = dead or DeadAddresses()  # none: replies to callers' inboxes, whose deaths this side never hears
        self._dead_seen = 0  # how many dead addresses this thread has pruned its sockets against

    def _prune(self) -> None:
        with self._lock:
            gone = self._dead.since(self._dead_seen)
            self._dead_seen = len(self._dead.addrs)
            closing = [self.socks.pop(a)[0] for a in gone if a in self.socks]
            for s in closing:
                self._registry.remove(s)
        for s in closing:
            s.close(0)

    def get(self, addr: str) -> tuple[zmq.Socket, Outbound]:
        if self._dead_seen != len(self._dead.addrs):
            self._prune()
        pair = self.socks.get(addr)
        if pair is None:
            s = tune(zmq_context().socket(zmq.DEALER))
            try:
                out = connect_channel(s, self._auth, addr)
            except BaseException:
                s.close(0)
                raise
            pair = self.socks[addr] = (s, out)
            with self._lock:
                self._registry.append(s)
        return pair

    def __del__(self) -> None:
        """Its thread ended. Messages may still be queued on its sockets (a call or a reply sent just before,
        on a connection not made yet: a thread's first message to a peer), so they close with a linger:
        libzmq sends what is queued in the background, and drops it only if the peer stays away that long
        (a linger of 0 here dropped most calls of threads that send and end at once; a test sends 40)."""
        try:
            with self._lock:
                for s, _ in self.socks.values():
                    if s in self._registry:
                        self._registry.remove(s)
            for s, _ in self.socks.values():
                s.close(_THREAD_END_LINGER_MS)
        except Exception:
            pass


_THREAD_END_LINGER_MS = 5000  # how long the sockets of an ended thread may take to send what they hold


class _CallerSockets(ThreadSockets):
    """A calling thread's :class:`ThreadSockets`, plus the calls it holds until its event loop's turn ends.

    Why: a burst of calls from a coroutine (``asyncio.gather`` over many ``call``) cost a message, a MAC,
    a send and a GIL release each, and the caller's thread traded the GIL with its reply thread at every
    send (issue 40: 0.13x raw zmq's pipelined rate). Calls made in one turn of a running event loop
    cannot be awaited before the turn ends, so they wait for it (``loop.call_soon``) and go as one
    message per destination proc: one MAC over the batch (its counter covers every call in it, and the
    server still drops a call id it served), one send. Calls from a thread with no running loop, large
    arguments and broadcasts (nothing waits on them: a coroutine, or a notebook cell on its kernel's
    loop, may block on something else next) are sent at once, after what the thread held (per actor,
    calls arrive in the order they were made). A thread that waits on a call (``get``, ``done``, a
    ``Stream``) sends what it holds first."""

    def __init__(self, auth: Authenticator, lock: threading.Lock, registry: list, dead: "DeadAddresses | None" = None):
        super().__init__(auth, lock, registry, dead)
        self.held: dict[str, list[tuple[str, int, str, str, bytes]]] = {}  # addr -> (kind, call id, actor, endpoint, args)
        self.held_bytes = 0
        self.held_loop: AbstractEventLoop | None = None  # the loop whose turn's end sends them (call_soon)


_HOLD_CALL_BYTES = 16 * 1024  # a call from an event loop with arguments this small waits for the turn's end
_HELD_BATCH_BYTES = 64 * 1024  # held calls go at once when this much is held
_HELD_CALL_OVERHEAD = 48  # what a held call adds to its batch beyond its arguments (ids, names: pickled, memoized)


class DeadAddresses:
    """Addresses of procs that died or were replaced, in the order they went (append-only, under the
    client's lock): each thread's :class:`ThreadSockets` closes its sockets to the new ones."""

    def __init__(self) -> None:
        self.addrs: list[str] = []

    def since(self, n: int) -> list[str]:
        return self.addrs[n:]


class Client:
    """Per-process caller: directory of procs, pending calls, and the IO thread."""

    def __init__(self, auth: Authenticator, identity: str):
        self.auth = auth
        self.identity = identity
        self.directory: dict[str, ProcEntry] = {}
        self._pending: dict[int, _Call] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._new_timeouts: deque = deque()
        self._timeouts: list[tuple[float, int]] = []
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._tls = threading.local()
        self._all_send_socks: list[zmq.Socket] = []
        self._dead = DeadAddresses()
        self._max_message = max_message_bytes()
        # Calls made from an event loop are held for the end of its turn when their arguments are this small,
        # and sent at once when this much is held (both well under the limit on a message).
        self._hold_call_bytes = min(_HOLD_CALL_BYTES, self._max_message // 4)
        self._held_batch_bytes = min(_HELD_BATCH_BYTES, self._max_message // 2)
        self._inbox = limit_messages(tune(zmq_context().socket(zmq.ROUTER)))  # before any frame is buffered
        self.inbox_addr, self._inbox_in = bind_channel(self._inbox, auth, f"{identity} replies", local=True)
        self._inbox_fd: int = self._inbox.getsockopt(zmq.FD)  # type: ignore[assignment]  # zmq.FD is an int option
        self._inbox_lock = threading.RLock()  # held by whoever reads the inbox (recursion: callbacks that wait)
        # Threads blocked in drive_until (a thread once per wait it is in), and event loops whose coroutines await
        # this client's futures (a _LoopReader each); while any reads, the IO thread leaves the inbox to them.
        # A list, not a count under the lock: append and remove are each one atomic step.
        self._drivers: list[int | _LoopReader] = []
        self._loop_readers: dict[AbstractEventLoop, _LoopReader] = {}
        # Set by the IO thread while it waits off the inbox because threads drive it: a future that gets a
        # consumer which does not read replies itself (an await, a callback) wakes it then (wake_reader).
        self._io_parked = False
        self.bytes_sent = 0
        self.bytes_received = 0
        self.reply_messages = 0  # messages read from the inbox (a batch of replies counts once)
        self.calls_sent = 0
        self.call_messages = 0  # messages those calls went in (calls of one turn of an event loop share one)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rlmesh-client-io", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ directory
    def proc_up(self, proc_id: str, addr: str, incarnation: int) -> None:
        with self._lock:
            cur = self.directory.get(proc_id)
            if cur is None or incarnation >= cur.incarnation:
                if cur is not None and cur.addr and cur.addr != addr and cur.alive:  # replaced without a down
                    self._dead.addrs.append(cur.addr)
                self.directory[proc_id] = ProcEntry(addr, incarnation, True)

    def proc_down(self, proc_id: str, incarnation: int, exit_code: int | None = None,
                  signal: int | None = None, reason: str = "") -> None:
        """Mark ``proc_id`` (up to ``incarnation``) dead and fail every call pending on it."""
        with self._lock:
            cur = self.directory.get(proc_id)
            if cur is not None and cur.incarnation <= incarnation:
                if cur.alive and cur.addr:
                    self._dead.addrs.append(cur.addr)
                cur.alive = False
                cur.death = (exit_code, signal, reason)
            elif cur is None:
                self.directory[proc_id] = ProcEntry("", incarnation, False, (exit_code, signal, reason))
            doomed = [cid for cid, c in self._pending.items()
                      if c.proc_id == proc_id and c.incarnation <= incarnation]
            calls = [self._pending.pop(cid) for cid in doomed]
        for c in calls:
            c._set_exception(self._died(c.mesh, c.rank, c.endpoint, exit_code, signal, reason))

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
                fut: Future = Future(driver=self)
                fut._set_exception(exc)
                return fut
            call_id = next(self._ids)
            fut = None  # type: ignore[assignment]  # no future for a broadcast
            if want_reply:
                deadline = None if timeout is None else time.monotonic() + timeout
                fut = self._pending[call_id] = _Call(self, proc_id, entry.incarnation, mesh, rank, endpoint,
                                                     actor_id, deadline, timeout)
            addr = entry.addr
        kind = P.CALL if want_reply else P.CAST
        bag = getattr(self._tls, "bag", None) or self._new_bag()
        loop = _get_running_loop()
        if want_reply and loop is not None and len(payload) == 1 and len(head := payload[0]) <= self._hold_call_bytes:
            # From an event loop: held for the end of this turn of it, then sent with the others this turn
            # made to the same proc, as one message (see _CallerSockets).
            if bag.held_loop is not loop:
                if bag.held:  # held on a loop that stopped before its turn ended: those go first
                    self._send_held(bag)
                bag.held_loop = loop
                loop.call_soon(self._send_held_at_turn_end, bag, loop)
            held = bag.held.get(addr)
            if held is None:
                held = bag.held[addr] = []
            held.append((kind, call_id, actor_id, endpoint, head if type(head) is bytes else bytes(head)))
            bag.held_bytes += len(head) + _HELD_CALL_OVERHEAD
            if bag.held_bytes >= self._held_batch_bytes:
                self._send_held(bag)
            if timeout is not None:
                self._arm_timeout(call_id, timeout)
            return fut
        if bag.held:  # what this thread held goes first: calls to one actor arrive in the order they were made
            self._send_held(bag)
        # The inbox address travels with casts too: with the call id it names the call uniquely
        # (the server drops a call id it already served from that inbox).
        meta = (kind, call_id, actor_id, endpoint, self.identity, self.inbox_addr)
        try:
            if self._closed:
                raise zmq.ZMQError(msg="the rlmesh client is closed")
            sock, out = bag.get(addr)  # this thread's DEALER to addr and its session: sockets are never shared
            frames = P.encode(out, meta, payload)
            size = nbytes(frames)
            if size > self._max_message:  # the server would drop it unread: say so here (one compare per call)
                check_message_size(frames, size, f"the call {mesh}[{rank}].{endpoint}")
            send_frames(sock, frames)
        except (zmq.ZMQError, AuthError) as exc:
            self._fail(call_id, ActorError(f"send to {addr} failed: {exc}", mesh=mesh, rank=rank,
                                           endpoint=endpoint))
            return fut
        except MessageTooLarge:  # like a pickling error: raised here, at the call
            with self._lock:
                self._pending.pop(call_id, None)
            raise
        with self._lock:
            self.calls_sent += 1
            self.call_messages += 1
            self.bytes_sent += size
        if timeout is not None and want_reply:
            self._arm_timeout(call_id, timeout)
        return fut

    def _arm_timeout(self, call_id: int, timeout: float) -> None:
        """Hand the IO thread call ``call_id``'s deadline (it fails the call with ``CallTimeout`` then)."""
        self._new_timeouts.append((time.monotonic() + timeout, call_id))
        os.eventfd_write(self._efd, 1)

    def _new_bag(self) -> "_CallerSockets":
        """This thread's first call: its sockets, one per destination, made as it first sends to each."""
        bag = self._tls.bag = _CallerSockets(self.auth, self._lock, self._all_send_socks, self._dead)
        return bag

    def send_held(self) -> None:
        """Send now the calls this thread holds for the end of its event loop's turn: before it waits on a
        call (``Future.get`` or ``done``, a ``Stream`` read in plain ``for``), which would hold them as long."""
        bag = getattr(self._tls, "bag", None)
        if bag is not None and bag.held:
            self._send_held(bag)

    def _send_held(self, bag: "_CallerSockets") -> None:
        """Send the calls ``bag``'s thread held: one message per destination proc, one MAC and one send
        each. Runs on that thread: at the end of its loop's turn, before it sends another way or blocks,
        or once ``_held_batch_bytes`` are held."""
        held, bag.held, bag.held_bytes, bag.held_loop = bag.held, {}, 0, None
        if not held:
            return
        sent = calls = messages = 0
        for addr, batch in held.items():
            try:
                if self._closed:
                    raise zmq.ZMQError(msg="the rlmesh client is closed")
                sock, out = bag.get(addr)
                if len(batch) > 1:
                    frames = P.encode(out, (P.CALLS, 0, "", "", self.identity, self.inbox_addr), P.pack_calls(batch))
                    size = nbytes(frames)
                    if size <= self._max_message:
                        send_frames(sock, frames)
                        sent += size
                        calls += len(batch)
                        messages += 1
                        continue
                for kind, call_id, actor_id, endpoint, head in batch:  # one call, or a batch over the limit
                    frames = P.encode(out, (kind, call_id, actor_id, endpoint, self.identity, self.inbox_addr), [head])
                    send_frames(sock, frames)
                    sent += nbytes(frames)
                    calls += 1
                    messages += 1
            except (zmq.ZMQError, AuthError) as exc:
                self._fail_sends([c[1] for c in batch], f"send to {addr} failed: {exc}")
        with self._lock:
            self.calls_sent += calls
            self.call_messages += messages
            self.bytes_sent += sent

    def _fail_sends(self, call_ids: list[int], why: str) -> None:
        with self._lock:
            calls = [c for c in map(self._pending.pop, call_ids, itertools.repeat(None)) if c is not None]
        for c in calls:
            c._set_exception(ActorError(why, mesh=c.mesh, rank=c.rank, endpoint=c.endpoint))

    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    def outstanding(self, actor_id: str) -> int:
        with self._lock:
            return sum(1 for c in self._pending.values() if c.actor_id == actor_id)

    # ------------------------------------------------------------------ IO thread
    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._io_parked = False  # nothing to wake any more: wake_reader must not write to a closing eventfd

    def _serve(self) -> None:
        while not self._closed:
            # While threads drive the inbox themselves, stay off it (no second wake-up per reply), until
            # woken: by wake_reader (a future got a consumer that does not read replies), by the last driver
            # leaving with calls still pending, or at _PARKED_S at the latest. Parked is set before the
            # drivers are read, so that a wake_reader racing this decision never finds it unset and parks.
            self._io_parked = True
            driven = self._driven()
            if not driven:
                self._io_parked = False
            timeout = _PARKED_S if driven else 0.2
            if self._timeouts:
                timeout = max(0.0, min(timeout, self._timeouts[0][0] - time.monotonic() + 0.0005))
            fds = [self._efd] if driven else [self._efd, self._inbox_fd]
            try:
                ready = wait_readable(fds, timeout)
            except (OSError, ValueError):
                if self._closed:
                    return
                raise
            if self._efd in ready:
                try:
                    os.eventfd_read(self._efd)
                except BlockingIOError:
                    pass
            if not self._driven() and self._inbox_lock.acquire(blocking=False):  # a driver may have come meanwhile
                try:
                    self._drain()  # also when only efd fired: zmq's FD is edge-triggered
                finally:
                    self._inbox_lock.release()
            while self._new_timeouts:
                heapq.heappush(self._timeouts, self._new_timeouts.popleft())
            if self._timeouts:
                self._expire()

    def wake_reader(self) -> None:
        """Make sure some thread reads the inbox: called when a future of this client gets a consumer that
        does not read replies itself (``await``, a done callback). Nothing to do while a thread drives the
        inbox or while the IO thread reads it; a write to its eventfd only when it is parked with no driver."""
        if self._io_parked and not self._closed and not self._driven():  # closed: its eventfd may be gone
            os.eventfd_write(self._efd, 1)

    def _driven(self) -> bool:
        """Whether a thread reads the inbox itself now: one blocked in ``drive_until``, or a running event loop
        with awaits on this client's futures (a loop that stopped with some still pending reads nothing)."""
        for d in self._drivers:
            if isinstance(d, int) or d.loop.is_running():
                return True
        return False

    def await_begins(self, loop: AbstractEventLoop) -> "_LoopReader | None":
        """A coroutine on ``loop`` (this thread's running loop) awaits one of this client's futures: the loop
        reads the inbox itself until its last such await ends (see :class:`_LoopReader`). ``None`` once closed."""
        r = self._loop_readers.get(loop)
        if r is None:
            if self._closed:
                return None
            r = _LoopReader(self, loop)
        r.awaits += 1
        return r

    def _send_held_at_turn_end(self, bag: "_CallerSockets", loop: AbstractEventLoop) -> None:
        """The end of the turn of ``loop`` that held calls: send them, and let the loop read their replies
        from now rather than from its first await on them, through the turn after this one. The awaits of
        a burst (``gather`` wraps each future in a task) begin only when those tasks first run, after this
        send: a reply back before then went to the IO thread, which then kept the inbox and completed the
        whole burst on its thread, waking the loop for it (seen at load ~3). With nobody awaiting by then the
        loop leaves the inbox again (:meth:`_LoopReader.ended`); a coroutine that blocks the loop polling
        ``done()`` meanwhile reads the inbox itself (:meth:`read_if_reading_here`)."""
        if bag.held_loop is loop and bag.held and loop.is_running():
            reader = self.await_begins(loop)
            if reader is not None:
                loop.call_soon(reader.ended)
        self._send_held(bag)

    def read_if_reading_here(self) -> None:
        """Drain the inbox on this thread if its running event loop is the one reading it (a coroutine polling
        ``Future.done()`` blocks that loop: nobody else reads meanwhile). Otherwise nothing."""
        loop = _get_running_loop()
        if loop is not None and loop in self._loop_readers and self._inbox_lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._inbox_lock.release()

    def drive_until(self, fut: Future, timeout: float | None) -> None:
        """Block until ``fut`` is done, reading the inbox from this thread meanwhile (no handoff).

        Raises ``TimeoutError`` after ``timeout`` seconds. Safe with any number of
        waiting threads: one reads and completes everyone's futures, the others
        sleep until their own future is done.
        """
        if fut._done:
            return
        bag = getattr(self._tls, "bag", None)
        if bag is not None and bag.held:  # this thread's calls held for its loop's turn: this wait would hold them
            self._send_held(bag)
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = _thread_waiter(self._inbox_fd)
        wake, inbox_fd, poll = waiter.wake, self._inbox_fd, waiter.poller.poll
        drivers = self._drivers
        drivers.append(waiter.ident)
        # Wake this thread only if another one completes the future: when this thread reads the reply
        # itself (the usual case) there is no one to wake, and no stale wake-up left for its next wait.
        fut._add_callback(waiter.on_done)
        flush_wakes()  # a done callback of a drain that waits here: the awaits it held are woken first
        # No drain before the first wait: whoever read the inbox last drained it until it was empty, and
        # then a message that arrives makes its descriptor readable, so poll sees a reply already there.
        # (The drain is what made the descriptor quiet; a message it left behind would not wake poll.)
        try:
            while not fut._done:
                if self._closed:
                    return  # close() fails every pending future
                if deadline is None:
                    ready = poll(_DRIVE_POLL_MS)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    ready = poll(min(poll_ms(left), _DRIVE_POLL_MS))  # type: ignore[type-var]  # left > 0: never None
                woken = False
                for fd, _ in ready:
                    if fd == wake:
                        try:
                            os.eventfd_read(wake)
                        except BlockingIOError:
                            pass
                    elif fd == inbox_fd:
                        woken = True
                if fut._done:
                    return
                if self._inbox_lock.acquire(blocking=False):
                    try:
                        self._drain(woken)
                    finally:
                        self._inbox_lock.release()
        finally:
            drivers.remove(waiter.ident)
            if self._io_parked and self._pending and not self._closed and not self._driven():  # calls left for the IO thread
                os.eventfd_write(self._efd, 1)

    def _drain(self, woken: bool = False) -> None:
        """Read every reply in the inbox and complete its future. ``woken``: its descriptor just polled
        readable, so a message is likely there and the first read skips the ``has_message`` check
        (1.35 µs, a ``ZMQ_EVENTS`` read); the loop still ends on one, which is what re-arms the descriptor."""
        outer = hold_wakes()  # awaits completed by this drain: one wake-up per event loop, not one each
        try:
            self._drain_held(woken)
        finally:
            release_wakes(outer)

    def _drain_held(self, woken: bool) -> None:
        inbox = self._inbox
        while woken or has_message(inbox):  # cheaper than a zmq.Again per drain
            woken = False
            try:
                frames = recv_frames(inbox, zmq.NOBLOCK)
            except zmq.Again:
                return
            body = frames[1:]
            size = nbytes(body)
            self.bytes_received += size
            try:
                (call_id, status), payload = P.decode_meta(self._inbox_in, body)
            except AuthError:
                continue  # counted, and logged at most once per peer per interval, by the channel
            except Exception as exc:
                logger.warning("dropped a malformed reply: %s", exc)
                continue
            self.reply_messages += 1
            if status == P.BATCH:  # a server's replies to several calls of this process, in one message
                try:
                    replies = P.unpack_replies(payload)
                except Exception as exc:
                    logger.warning("dropped a malformed batch of replies: %s", exc)
                    continue
                for call_id, status, head in replies:
                    self._complete(call_id, status, [head])
            else:
                self._complete(call_id, status, payload)

    def _complete(self, call_id: int, status: str, payload: list[Any]) -> None:
        with self._lock:
            c = self._pending.pop(call_id, None)
        if c is None:
            return  # timed out or failed already
        try:
            if status == P.OK:
                c._set_result(loads(payload))
            else:
                c._set_exception(error_from_payload(payload, c.mesh, c.rank, c.endpoint))
        except Exception as exc:  # e.g. the result's class is not importable here
            c._set_exception(ActorError(
                f"could not decode the result in the caller: {exc}", mesh=c.mesh, rank=c.rank,
                endpoint=c.endpoint))

    def _fail(self, call_id: int, exc: BaseException) -> None:
        with self._lock:
            c = self._pending.pop(call_id, None)
        if c is not None:
            c._set_exception(exc)

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
        for r in list(self._loop_readers.values()):  # their loops stop watching the inbox (each on its own thread)
            try:
                r.loop.call_soon_threadsafe(r.leave)
            except RuntimeError:  # that loop is closed: it watches nothing
                pass
        with self._lock:
            socks, self._all_send_socks = self._all_send_socks, []
            calls = list(self._pending.values())
            self._pending.clear()
        for s in socks:
            s.close(0)
        self._inbox.close(0)
        for c in calls:
            c._set_exception(ActorError("the runtime shut down before a reply came", mesh=c.mesh,
                                            rank=c.rank, endpoint=c.endpoint))
        try:
            os.close(self._efd)
        except OSError:
            pass


_DRIVE_POLL_MS = 200  # a waiting thread looks at ``closed`` and its deadline at least this often
_BUSY_INBOX_S = 0.001  # a loop that found another thread reading the inbox looks again after this


class _LoopReader:
    """An event loop that reads its client's inbox itself while coroutines on it await that client's futures.

    Why: the IO thread used to read every reply of an ``await``, so each burst of replies woke a second
    thread that completed the futures, traded the GIL with the loop's thread (which was often still making
    calls) and wrote the loop's self-pipe to wake it (issue 40). Now the loop watches the inbox's descriptor
    (``add_reader``) from an await's start until its last await on the client ends (at the next turn, so that
    a coroutine awaiting call after call keeps it), and it counts as a driver: the IO thread stays off the
    inbox meanwhile, as for a thread blocked in ``get()``. A reply read on the loop's thread resolves its
    await directly. Used on the loop's thread only, but for ``_driven`` (read from the IO thread)."""

    __slots__ = ("client", "loop", "fd", "awaits", "leaving", "watching")

    def __init__(self, client: Client, loop: AbstractEventLoop):
        self.client = client
        self.loop = loop
        self.fd = client._inbox_fd
        self.awaits = 0
        self.leaving = False
        client._loop_readers[loop] = self
        client._drivers.append(self)
        loop.add_reader(self.fd, self.readable)
        self.watching = True

    def readable(self) -> None:
        """The inbox's descriptor polled readable: drain it, unless another thread is reading it (it drains
        until empty); then look again in a moment rather than spin on a descriptor that thread is emptying."""
        c = self.client
        if c._closed:
            self.leave()
        elif c._inbox_lock.acquire(blocking=False):
            try:
                c._drain(True)
            finally:
                c._inbox_lock.release()
        elif self.watching:
            self.watching = False
            self.loop.remove_reader(self.fd)
            self.loop.call_later(_BUSY_INBOX_S, self._watch)

    def _watch(self) -> None:
        if self.client._loop_readers.get(self.loop) is self and not self.watching and not self.client._closed:
            self.watching = True
            self.loop.add_reader(self.fd, self.readable)

    def ended(self) -> None:
        """An await of this loop on the client ended; the last one leaves at the next turn, if no other began."""
        self.awaits -= 1
        if not self.awaits and not self.leaving:
            self.leaving = True
            self.loop.call_soon(self._maybe_leave)

    def _maybe_leave(self) -> None:
        self.leaving = False
        if not self.awaits:
            self.leave()

    def leave(self) -> None:
        """Stop reading the inbox; the IO thread takes it back when calls are still pending."""
        c = self.client
        if self.watching:
            self.watching = False
            try:
                self.loop.remove_reader(self.fd)
            except (OSError, ValueError):  # the client closed the inbox meanwhile
                pass
        if c._loop_readers.get(self.loop) is self:
            del c._loop_readers[self.loop]
        try:
            c._drivers.remove(self)
        except ValueError:
            pass
        if c._io_parked and c._pending and not c._closed and not c._driven():
            os.eventfd_write(c._efd, 1)
_PARKED_S = 0.05  # the IO thread, parked while threads drive the inbox, looks again at least this often


class _Waiter:
    """What a thread needs to wait in :meth:`Client.drive_until`, made once per thread (and again for a
    new client's inbox, after :func:`reset_client`): an eventfd that another thread writes to wake it, a
    ``poll`` object over that and the inbox, and the done callback that writes the eventfd. Kept, because
    building and registering them per wait cost ~1 µs of a blocking call's path.

    The eventfd is not cleared when a wait ends (a syscall and an exception per call): a wake-up left over
    from an earlier wait (another thread completed that future just as this one saw it done) costs one
    extra pass of ``drive_until``'s loop, which reads it."""

    __slots__ = ("ident", "wake", "inbox_fd", "poller")

    def __init__(self, inbox_fd: int):
        self.ident = threading.get_ident()
        self.wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.inbox_fd = inbox_fd
        self.poller = self._poller()

    def _poller(self) -> select.poll:
        p = select.poll()
        p.register(self.inbox_fd, select.POLLIN)
        p.register(self.wake, select.POLLIN)
        return p

    def retarget(self, inbox_fd: int) -> None:
        self.inbox_fd = inbox_fd
        self.poller = self._poller()

    def on_done(self, _fut: Future) -> None:
        if threading.get_ident() != self.ident:  # completed by another thread: this one is asleep in poll
            os.eventfd_write(self.wake, 1)

    def __del__(self) -> None:  # its thread ended (thread-locals die with it): a thread pool's threads come and go
        try:
            os.close(self.wake)
        except (OSError, TypeError, AttributeError):  # already closed, or the interpreter is shutting down
            pass


_tls_wake = threading.local()


def _thread_waiter(inbox_fd: int) -> _Waiter:
    w = getattr(_tls_wake, "waiter", None)
    if w is None:
        w = _tls_wake.waiter = _Waiter(inbox_fd)
    elif w.inbox_fd != inbox_fd:
        w.retarget(inbox_fd)
    return w


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
