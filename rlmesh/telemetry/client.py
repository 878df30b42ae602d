"""The worker's side of the service: a batch sender that never blocks, and a query client.

"Never blocks" is literal: batches are sent with ``NOBLOCK`` on a PUSH socket with
``IMMEDIATE`` set, so when the service is gone (or not yet reachable) the send fails
at once instead of queueing without bound. Failed batches wait in a bounded backlog
(oldest dropped first) and are retried on every flush; the first time the service is
unreachable for more than a few seconds, one warning says so, and one info line says
when it is back.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import secrets
import time
from typing import TYPE_CHECKING, Any

import zmq

from rlmesh.telemetry import limits, wire
from rlmesh.telemetry.errors import ReadOnlyQueryError, ServiceUnavailableError, TelemetryError
from rlmesh.transport import Authenticator, connect_channel
from rlmesh.transport.sockets import max_message_bytes

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

logger = logging.getLogger(__name__)

MAX_BACKLOG_ROWS = 1_000_000
WARN_AFTER_S = 3.0
CONFIRM_MAX_S = 30.0  # at close, keep waiting for the service's confirmation this long at most, while it progresses
MAX_ROWS_PER_MESSAGE = 131_072  # big batches go as several messages: bounded memory spikes on both ends

_ctx: zmq.Context | None = None
_ctx_pid = -1


def telemetry_context() -> zmq.Context:
    """A zmq context (own I/O thread) for telemetry only, so bulk rows never queue behind,
    or delay, the runtime's control-plane messages on the shared context."""
    global _ctx, _ctx_pid
    if _ctx is None or _ctx_pid != os.getpid():
        _ctx, _ctx_pid = zmq.Context(io_threads=1), os.getpid()
    return _ctx


def message_budget() -> int:
    """Bytes of rows one message carries at most: a quarter of what the service's ingest socket takes
    (``RLMESH_MAX_MESSAGE_MB``), so wide rows (samples, logs) travel as several messages, never as
    one the socket would drop unread."""
    return max(1, max_message_bytes() // 4)


def split_messages(batches: list[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
    """Group batches into messages of at most MAX_ROWS_PER_MESSAGE rows and about
    :func:`message_budget` bytes (slices are zero-copy). Raw rows
    (:class:`~rlmesh.telemetry.wire.RawRows`, a small flush's) are never split."""
    budget = message_budget()
    out: list[list[tuple[str, Any]]] = []
    cur: list[tuple[str, Any]] = []
    rows, size = 0, 0.0
    for table, tbl in batches:
        if isinstance(tbl, wire.RawRows):
            cur.append((table, tbl))
            rows += tbl.num_rows
            continue
        per_row = tbl.nbytes / tbl.num_rows if tbl.num_rows else 0.0
        step = max(1, min(MAX_ROWS_PER_MESSAGE, int(budget // per_row) if per_row else MAX_ROWS_PER_MESSAGE))
        for off in range(0, max(tbl.num_rows, 1), step):
            part = tbl.slice(off, step)
            nbytes = part.num_rows * per_row
            if cur and (rows + part.num_rows > MAX_ROWS_PER_MESSAGE or size + nbytes > budget):
                out.append(cur)
                cur, rows, size = [], 0, 0.0
            cur.append((table, part))
            rows += part.num_rows
            size += nbytes
    if cur:
        out.append(cur)
    return out


class RemoteSink:
    """Callable sink for :class:`~rlmesh.telemetry.recorder.Recorder` in worker procs."""

    def __init__(self, addr: str, auth: Authenticator, origin: str, query_addr: str | None = None):
        self.addr = addr
        self.auth = auth
        self.origin = origin
        self.query_addr = query_addr
        """The service's query socket: at close, where the sink asks which of its batches arrived."""
        self._last_sent = 0  # the newest batch number zmq accepted (they go out in order)
        self._acked = 0  # the newest batch number the service said it holds
        self._sock: zmq.Socket | None = None
        self._out: Any = None
        self._id = secrets.token_hex(8)  # with the seq, names each batch uniquely (idempotent ingest)
        self._seq = itertools.count(1)
        self._backlog: collections.deque[tuple[int, list[tuple[str, Any]]]] = collections.deque()
        self._backlog_rows = 0
        self._failing_since: float | None = None
        self._warned = False
        self.dropped_rows = 0
        self._socket()  # connect now, so the link is up by the first flush

    @property
    def backlog_rows(self) -> int:
        """Rows waiting for the service to take them. Beyond ``MAX_BACKLOG_ROWS`` the oldest batches are
        dropped (and counted in ``dropped_rows``), all but the newest."""
        return self._backlog_rows

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            s = telemetry_context().socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 2000)  # give the last batches a moment at exit
            s.setsockopt(zmq.SNDHWM, 256)
            s.setsockopt(zmq.IMMEDIATE, 1)
            self._out = connect_channel(s, self.auth, self.addr)
            self._sock = s
        return self._sock

    def __call__(self, batches: list[tuple[str, Any]]) -> None:
        if not batches and not self._backlog:
            return
        for msg in split_messages(batches):
            self._backlog.append((next(self._seq), msg))
            self._backlog_rows += sum(t.num_rows for _, t in msg)
        sock = self._socket()
        while self._backlog:
            seq, head = self._backlog[0]
            frames = wire.encode_batches(self._out, self.origin, head, (self._id, seq))
            if sum(memoryview(getattr(f, "buffer", f)).nbytes for f in frames) > max_message_bytes():
                self._too_large(head)  # a row wider than the service takes: it would drop the message unread
                continue
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._unreachable()
                return
            self._backlog.popleft()
            self._backlog_rows -= sum(t.num_rows for _, t in head)
            self._last_sent = seq
        if self._failing_since is not None and self._warned:
            logger.info("telemetry service %s reachable again", self.addr)
        self._failing_since, self._warned = None, False

    def _too_large(self, head: list[tuple[str, Any]]) -> None:
        self._backlog.popleft()
        n = sum(t.num_rows for _, t in head)
        self._backlog_rows -= n
        self.dropped_rows += n
        logger.warning("telemetry: dropped %d rows of %s: one message of them is over the %d MB the service takes "
                       "(RLMESH_MAX_MESSAGE_MB); record smaller rows, or raise it for the whole job", n,
                       ", ".join(sorted({t for t, _ in head})), max_message_bytes() >> 20)

    def _unreachable(self) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        while self._backlog_rows > MAX_BACKLOG_ROWS and len(self._backlog) > 1:
            _, old = self._backlog.popleft()
            n = sum(t.num_rows for _, t in old)
            self._backlog_rows -= n
            self.dropped_rows += n
        if not self._warned and now - self._failing_since > WARN_AFTER_S:
            self._warned = True
            logger.warning(
                "telemetry service %s unreachable for %.0fs; this proc keeps running and buffers up to "
                "%d rows (oldest dropped first). Said once.", self.addr, now - self._failing_since, MAX_BACKLOG_ROWS,
            )

    def close(self, timeout: float = 2.0) -> None:
        """At proc exit: ship the backlog (up to ``timeout`` s), then, with a ``query_addr``, wait
        until the service confirms it holds every batch: a batch zmq accepted can still sit in its
        queue when the socket closes, and the linger running out would drop it without a word.
        The wait goes on past ``timeout`` while the service makes progress (an overloaded service
        drains slowly; ``CONFIRM_MAX_S`` at most); what stays unconfirmed is said in a warning."""
        start = time.monotonic()
        deadline = start + timeout
        while self._backlog and time.monotonic() < deadline:
            self([])
            if self._backlog:
                time.sleep(0.02)
        if self._backlog:
            logger.warning("telemetry: %d rows not shipped at exit (service %s unreachable)",
                           self._backlog_rows, self.addr)
        self._await_confirmation(deadline, start + CONFIRM_MAX_S)
        if self._sock is not None:
            linger = 0.0 if self.query_addr and not self.unconfirmed else max(0.1, deadline - time.monotonic())
            self._sock.close(linger=int(linger * 1000))
            self._sock = None
        close_context()  # waits (up to the linger) until queued batches are on the wire

    @property
    def unconfirmed(self) -> int:
        """Batches zmq accepted that the service has not (yet) said it holds (known with a ``query_addr``)."""
        return self._last_sent - self._acked if self.query_addr else 0

    def _await_confirmation(self, deadline: float, hard_deadline: float) -> None:
        while self.unconfirmed and time.monotonic() < min(deadline, hard_deadline):
            try:
                answer, _ = ask(self.query_addr, self.auth, "acked", self._id,  # type: ignore[arg-type]  # query_addr is set while rows are unconfirmed
                                timeout=max(0.1, deadline - time.monotonic()))
            except TelemetryError:  # gone, or too busy to answer in time: nothing more to learn
                break
            acked = int(answer)
            if acked > self._acked:  # progress: the service is draining this sink's queue, give it time
                self._acked, deadline = acked, max(deadline, time.monotonic() + 2.0)
            if self.unconfirmed:
                time.sleep(0.05)
        if self.unconfirmed:
            logger.warning("telemetry: %d batches sent but not confirmed by the service %s at exit; they may be "
                           "lost (an overloaded service, or one that is gone)", self.unconfirmed, self.addr)


def close_context() -> None:
    """Terminate the telemetry context: blocks until sent messages left the process or their linger ran out.

    Without it, a proc that exits right after its last flush can lose that batch: zmq sends
    from a background I/O thread that dies with the process.
    """
    global _ctx
    if _ctx is not None and _ctx_pid == os.getpid():
        # term() blocks until every socket of the context is closed: in a process that also hosts the
        # telemetry service or a query (a controller, a test), another socket is open, and that process
        # lives on anyway, so its I/O thread keeps sending. pyzmq's context tracks its sockets weakly.
        if any(not s.closed for s in getattr(_ctx, "_sockets", ())):
            return
        _ctx.term()
    _ctx = None


ANSWER_GRACE_S = 10.0
"""How long past a query's limit its client waits for the service's answer (the "stopped at its limit" error)."""


def remote_query(addr: str, auth: Authenticator, sql: str, timeout: float | None = None) -> pa.Table:
    """Ask a live service; raises the service's error (read-only refusal, SQL error, time limit) here.

    ``timeout``: the query's time limit (default ``RLMESH_QUERY_TIMEOUT_S``), which the service
    enforces with DuckDB's interrupt; a client that stops waiting (its limit, Ctrl-C, a cancelled
    :class:`~rlmesh.telemetry.limits.Scope`) tells the service, which interrupts the query then."""
    limit = limits.limit_for(timeout)
    qid = secrets.token_hex(8)
    with limits.guarded(limit + ANSWER_GRACE_S) as guard:
        return ask(addr, auth, "query", (sql, limit, qid), limit + ANSWER_GRACE_S, guard=guard, qid=qid)[1][0]


def ask(addr: str, auth: Authenticator, kind: str, payload: Any, timeout: float = 60.0,
        guard: limits.Guard | None = None, qid: str | None = None) -> tuple[Any, list[pa.Table]]:
    """One request to a live service: ``(reply payload, reply tables)``, or the service's error raised here.
    An ``acked`` reply is a plain number in the payload: a closing proc that asks it loads no pyarrow.
    ``guard``: the wait also ends when it fires (cancelled); ``qid``: the query the service is told to stop
    when the wait ends without an answer."""
    sock = telemetry_context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    answered = False
    try:
        out = connect_channel(sock, auth, addr)
        replies = out.reply_inbound("telemetry query replies")
        sock.send_multipart(wire.encode(out, kind, payload), copy=False)
        deadline = time.monotonic() + timeout
        while not sock.poll(int(min(0.1, max(0.0, deadline - time.monotonic())) * 1000)):
            if guard is not None and guard.fired is not None and guard.fired != limits.TIMEOUT:
                raise guard.error()
            if time.monotonic() >= deadline:
                raise ServiceUnavailableError(
                    f"telemetry service {addr} did not answer within {timeout:.0f}s; if the run has ended, "
                    "query its file instead (rlmesh sql RUN ...)"
                )
        (status, answer), tables = wire.decode(replies, sock.recv_multipart(copy=False))
        answered = True
    finally:
        if not answered and qid is not None:  # gone without an answer (limit, Ctrl-C, cancel): stop the query
            with contextlib.suppress(Exception):
                sock.send_multipart(wire.encode(out, "cancel", qid), flags=zmq.NOBLOCK, copy=False)
                sock.setsockopt(zmq.LINGER, 500)
        sock.close()
    if status == "ok":
        return answer, tables
    exc_type, msg = answer
    if exc_type == "ReadOnlyQueryError":
        raise ReadOnlyQueryError(msg)
    if exc_type in ("QueryTimeoutError", "QueryCancelledError", "ServiceUnavailableError"):
        raise getattr(limits, exc_type, ServiceUnavailableError)(msg)
    if exc_type.endswith("Exception") or exc_type.endswith("Error"):
        import duckdb  # deferred: DuckDB is heavy; only the reading process needs it

        cls = getattr(duckdb, exc_type, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            raise cls(msg)
    raise TelemetryError(f"{exc_type}: {msg}")
