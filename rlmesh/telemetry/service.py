"""The telemetry service: one per run, in the controller process, sole writer of the DuckDB file.

Why in the controller: it is the one process that lives as long as the run, and an
in-process service lets the controller's own rows skip the network. Three threads:

- *writer*: drains the ingest queue within 0.1 s, concatenates batches per table
  and appends them (each append commits, so rows reach the WAL on disk well within
  the one-second durability promise, and survive a SIGKILL of the controller);
- *receiver*: a PULL socket for batches from worker procs (MAC checked first);
- *queries*: a ROUTER socket answering live read-only SQL, so that nobody else
  needs to open the locked file while the run is going.

Opening the file is off the run's critical path: :meth:`TelemetryService.start` binds the two
sockets (their addresses are all a proc needs), starts the receiver and the query thread, and
returns; a fourth thread, *opener*, loads DuckDB and pyarrow (~0.3 s of CPU), opens or creates
the database, and only then starts the writer. Batches received meanwhile (acknowledged to
their senders at once) wait in the ingest queue; queries wait for the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import zmq

from rlmesh import settings
from rlmesh.telemetry import limits, wire
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.client import telemetry_context
from rlmesh.telemetry.errors import TelemetryError
from rlmesh.telemetry.schema import SchemaError
from rlmesh.transport import AuthError, Authenticator, bind_channel
from rlmesh.transport.sockets import limit_messages, tune

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from rlmesh.telemetry.store import Store

logger = logging.getLogger(__name__)

Batches = list[tuple[str, Any]]
# [(table name, pyarrow.Table), ...]: what a recorder's flush hands the service
OPEN_TIMEOUT_S = 60.0
COALESCE_S = 0.1
COALESCE_ROWS = 1_000_000
RUN_JSON_EVERY_S = 5.0
MAX_QUERIES = 8  # live queries running at once; each on its own thread and DuckDB cursor, each with a time limit


def _rows(item: Any) -> int:
    return sum(t.num_rows for _, t in item[1]) if item else 0


class TelemetryService:
    """Start with :meth:`start`; :meth:`stop` finalises the ``runs`` row and closes the file."""

    def __init__(self, run_dir: Path, run_id: str, auth: Authenticator, config: Any = None, resume: bool = False,
                 importing: Callable[[], ContextManager[Any]] = contextlib.nullcontext):
        self.run_dir = Path(run_dir)
        self._importing = importing  # around the opener's imports (rlmesh.telemetry.exit_order; tests hold it)
        self.run_id = run_id
        self.auth = auth
        self.db_path = self.run_dir / runs.DB_NAME
        self._store: Store | None = None
        self._config = config
        self._resume = resume
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        self._open_lock = threading.Lock()  # set_config before the file is open keeps the config for the opener
        self.resumed = False
        self.started = time.time()
        before = (runs.read_json(self.run_dir / runs.RUN_JSON) or {}) if resume else {}
        self.first_started = float(before.get("start_ts") or self.started)  # the whole run's start, across resumes
        self.rows_before = int(before.get("rows") or 0)  # rows of earlier controller generations
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()  # (ticket, batches) | [] | None
        self._submitted = 0  # ingest tickets handed out
        self._written = 0  # highest ticket in the file
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._threads: list[threading.Thread] = []
        self._opener: threading.Thread | None = None
        self._snap: Any = None
        self.ingest_addr = self.query_addr = ""
        self._last_recv = 0.0
        self._batch_seq: dict[str, int] = {}  # sender id -> last batch stored (ingest is idempotent)
        self.duplicate_batches = 0
        self._run_json_at = time.monotonic()
        self._queries: dict[str, limits.Scope] = {}  # query id -> its scope (cancel() interrupts it)
        self._replies: queue.SimpleQueue[Any] = queue.SimpleQueue()  # from query threads to the query loop
        self._wake_r, self._wake_w = os.pipe()  # a query thread's reply wakes the query loop's poll
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    @property
    def store(self) -> Store:
        """The run's database, once the opener has it open (waits for it; raises if it could not)."""
        if not self._opened.wait(OPEN_TIMEOUT_S):
            raise TelemetryError(f"telemetry: {self.db_path} was not open after {OPEN_TIMEOUT_S:.0f} s")
        if self._store is None:
            raise TelemetryError(f"telemetry: could not open {self.db_path}: {self._open_error!r}")
        return self._store

    def _open(self) -> None:
        """On the opener thread: the database (created, or for a resume reopened), then the threads that use it."""
        try:
            # DuckDB and pyarrow (~0.3 s of CPU) load here, off the run's start. Their exit handlers must
            # run after the run's own, which writes its last rows (rlmesh.telemetry.exit_order)
            with self._importing():
                from rlmesh.telemetry.store import Store  # deferred: pyarrow and DuckDB, see above

            store = Store(self.db_path, self.run_id)
            with self._open_lock:
                self.resumed = self._resume and bool(store.con.execute(
                    "SELECT count(*) FROM runs WHERE id = ?", [self.run_id]).fetchone()[0])  # type: ignore[index]  # count(*) returns one row
                if self.resumed:  # a resumed run: the same row goes back to running
                    store.execute_write("UPDATE runs SET status = 'running', end_ts = NULL, error = NULL, pid = ?, "
                                        "argv = ? WHERE id = ?", [os.getpid(), " ".join(sys.argv), self.run_id])
                    if self._config is not None:
                        self._set_config(store, self._config)
                else:
                    self._insert_run_row(store, self._config)
                self._store = store
        except BaseException as exc:  # noqa: BLE001 - said once here; queries and stop() say it again
            self._open_error = exc
            logger.exception("telemetry: could not open %s; this run records nothing", self.db_path)
            self._opened.set()
            with self._cv:
                self._cv.notify_all()  # sync() waiters: nothing will be written
            return
        self._opened.set()
        if self._stop.is_set():
            return  # stopped while opening: stop() finishes the file
        self._thread("writer", self._write_loop)
        with self._importing():
            from rlmesh.telemetry import snapshots  # deferred: pyarrow.parquet, loaded with the store above

        every = snapshots.interval_from_env()  # Parquet under runs/<run>/live/ for pandas, polars & co.
        self._snap = snapshots.Snapshotter(store.con, self.run_dir, every, store.write_marks).start() if every else None
        logger.info("telemetry: run %s recording to %s", self.run_id, self.db_path)

    # ---- lifecycle -------------------------------------------------------------------
    def start(self, wait: bool = False) -> "TelemetryService":
        """Bind the sockets and return; the opener thread opens the file (``wait``: until it has)."""
        ctx = telemetry_context()
        # frames over RLMESH_MAX_MESSAGE_MB are dropped at their size header, before any is buffered:
        # both sockets read before they authenticate (senders split their rows to fit: client.py)
        self._pull = limit_messages(tune(ctx.socket(zmq.PULL)))
        self._router = limit_messages(tune(ctx.socket(zmq.ROUTER)))
        self.ingest_addr, self._ingest_in = bind_channel(self._pull, self.auth, "telemetry ingest")
        self.query_addr, self._query_in = bind_channel(self._router, self.auth, "telemetry queries")
        info = {"run_id": self.run_id, "ingest_addr": self.ingest_addr, "query_addr": self.query_addr,
                "secret": settings.SECRET.get(), "pid": os.getpid(), "host": socket.gethostname()}
        runs.write_json(self.run_dir / runs.SERVICE_JSON, info, private=True)
        self._write_run_json("running")
        self._thread("recv", self._recv_loop)  # batches are received (and acknowledged) while the file opens
        self._thread("query", self._query_loop)
        self._opener = threading.Thread(target=self._open, name="rlmesh-telemetry-opener", daemon=True)
        self._opener.start()
        if wait:
            self.store  # noqa: B018 - raises here if the file could not be opened
        return self

    def _thread(self, name: str, fn: Callable[[], None]) -> None:
        t = threading.Thread(target=fn, name=f"rlmesh-telemetry-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, status: str = "ok", error: str | None = None) -> None:
        """Drain, mark the run finished (``error``: why it failed, kept in ``runs.error``), checkpoint
        and close. Idempotent. The database row is committed before ``run.json`` is rewritten: a
        kill in between is settled from the database (:func:`runs.settle_dead_runs`)."""
        if self._stop.is_set():
            return
        if self._opener is not None:
            self._opener.join(OPEN_TIMEOUT_S)
        if self._store is None:  # never opened: nothing was written, nothing to finish
            self._stop.set()
            self._q.put(None)
            for t in self._threads:
                t.join(timeout=5)
            self._close_sockets()
            return
        give_up = time.monotonic() + 1.0
        while time.monotonic() - self._last_recv < 0.15 and time.monotonic() < give_up:
            time.sleep(0.02)  # procs that just exited may still have their last batches in flight
        self.sync(timeout=10)
        self._cancel_queries("the run is ending")  # a query still running must not hold the file at close
        self._stop.set()
        self._q.put(None)
        for t in self._threads:
            t.join(timeout=5)
        if getattr(self, "_snap", None) is not None:
            self._snap.stop()  # the file itself is readable from now on
        try:
            self.store.execute_write("UPDATE runs SET end_ts = now(), status = ?, error = ? WHERE id = ?",
                                     [status, error, self.run_id])
            self.store.close()
        finally:
            (self.run_dir / runs.SERVICE_JSON).unlink(missing_ok=True)
            self._write_run_json(status, end=time.time(), error=error)
        self._close_sockets()
        logger.info("telemetry: run %s %s; %d rows in %s", self.run_id, status, self.store.rows_written, self.store.path)

    def _close_sockets(self) -> None:
        for s in (self._pull, self._router):
            s.close(0)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _insert_run_row(self, store: Store, config: Any) -> None:
        store.execute_write(
            "INSERT INTO runs (run_id, ts, mesh, rank, proc, id, config, start_ts, status, argv, pid, host) "
            "VALUES (?, now(), 'controller', -1, 'controller', ?, ?, to_timestamp(?), 'running', ?, ?, ?)",
            [self.run_id, self.run_id, json.dumps(config, default=str) if config is not None else None,
             self.started, " ".join(sys.argv), os.getpid(), socket.gethostname()],
        )

    def set_config(self, config: Any) -> None:
        """Store ``config`` on the run's row (kept for the opener when the file is not open yet)."""
        with self._open_lock:
            if self._store is None:
                self._config = config
                return
        self._set_config(self._store, config)

    def _set_config(self, store: Store, config: Any) -> None:
        store.execute_write("UPDATE runs SET config = ? WHERE id = ?", [json.dumps(config, default=str), self.run_id])

    def _write_run_json(self, status: str, end: float | None = None, error: str | None = None) -> None:
        runs.write_json(self.run_dir / runs.RUN_JSON, {
            "id": self.run_id, "status": status, "start_ts": self.first_started, "end_ts": end,
            "generation_start_ts": self.started, "pid": os.getpid(), "host": socket.gethostname(), "argv": sys.argv,
            "rows": self.rows_before + (self._store.rows_written if self._store else 0), "error": error,
        })

    # ---- ingest ----------------------------------------------------------------------
    def ingest(self, batches: Batches) -> int:
        """Queue batches for the writer; never blocks on disk. Returns a ticket for :meth:`sync`."""
        if not batches or self._open_error is not None:  # no file to write to: said once, at the failed open
            return 0
        with self._cv:
            self._submitted += 1
            ticket = self._submitted
            self._q.put((ticket, batches))
        return ticket

    def sync(self, timeout: float = 10.0, ticket: int | None = None) -> bool:
        """Wait until ingest ``ticket`` (default: everything so far) is in the file.

        This is the controller's read-your-writes; a ticket already written returns at
        once, so polling queries do not break the writer's coalescing.
        """
        deadline = time.monotonic() + timeout
        with self._cv:
            target = self._submitted if ticket is None else ticket
            if self._written < target:
                self._q.put([])  # cut the writer's coalescing window short
            while self._written < target and self._open_error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return self._open_error is None

    def _write_loop(self) -> None:
        every = settings.TELEMETRY_CHECKPOINT_S.get()
        next_checkpoint, dirty = time.monotonic() + every, False
        failing = False  # the last checkpoint failed: said once, not every `every` seconds (a full disk stays full)
        while True:
            try:
                items = [self._q.get(timeout=max(0.05, next_checkpoint - time.monotonic()))]
            except queue.Empty:
                items = [[]]
            if time.monotonic() >= next_checkpoint:
                next_checkpoint = time.monotonic() + every
                if dirty:  # the log folded into the file: a torn log can cost at most `every` seconds of rows
                    dirty = False
                    try:
                        done = self.store.checkpoint()
                    except Exception:  # noqa: BLE001 - the rows are in the log; the next try may succeed
                        if not failing:
                            logger.warning("telemetry: checkpoint of %s failed; the rows stay in its write-ahead "
                                           "log, and it is tried again every %g s", self.db_path, every,
                                           exc_info=True)
                        failing = True
                    else:
                        if not done:  # a live query's transaction is open, so DuckDB refuses now: next turn
                            dirty = True
                        elif failing:
                            logger.info("telemetry: checkpoints of %s work again", self.db_path)
                            failing = False
            # Coalesce for up to COALESCE_S (or COALESCE_ROWS): DuckDB appends one 1 M-row batch
            # ~1.7x faster than ten 100 k-row ones (each append is a commit), and rows still reach
            # the WAL well within the one-second durability promise.
            deadline = time.monotonic() + COALESCE_S
            rows = _rows(items[0])
            while rows < COALESCE_ROWS and items[-1]:  # [] = sync() wants it now; None = stop
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    items.append(self._q.get(timeout=left))
                except queue.Empty:
                    break
                rows += _rows(items[-1])
            work = [it for it in items if it]
            try:
                self._write(batches for _, batches in work)
            except Exception:
                logger.exception("telemetry writer failed on a batch")
            if work:
                dirty = True
                self.store.save_committed()  # after the commit: what durability.check compares at the next open
            with self._cv:
                if work:
                    self._written = max(self._written, work[-1][0])
                self._cv.notify_all()
            if None in items:
                return
            if time.monotonic() - self._run_json_at > RUN_JSON_EVERY_S:  # `rlmesh runs` shows progress
                self._run_json_at = time.monotonic()
                self._write_run_json("running")

    def _write(self, items: Any) -> None:
        import pyarrow as pa  # deferred: loaded with the store by the opener; here a dict lookup

        per_table: dict[str, list[pa.Table]] = {}
        for batches in items:
            for table, tbl in batches:
                per_table.setdefault(table, []).append(tbl)
        for table, tbls in per_table.items():
            try:
                merged = [pa.concat_tables(tbls, promote_options="default")] if len(tbls) > 1 else tbls
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                merged = tbls  # types differ between batches: append one by one, find the culprit
            for tbl in merged:
                try:
                    self.store.append(table, tbl)
                except SchemaError as exc:
                    if len(self.errors) < 100:  # the rows themselves are in _rejected
                        self.errors.append(str(exc))

    def _recv_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            frames = self._pull.recv_multipart(copy=False)
            self._last_recv = time.monotonic()
            try:
                header, tables = wire.decode(self._ingest_in, frames)
            except AuthError:
                continue  # counted, and logged at most once per peer per interval, by the channel
            except Exception:
                logger.exception("telemetry: undecodable batch")
                continue
            if header[0] == "batches" and len(header) in (4, 5) and self._first_time(header[3]):
                batches = list(zip(header[2], tables))
                if len(header) == 5 and header[4]:
                    batches += self._from_raw(header[4], header[1])
                self.ingest(batches)
                # Marked after it is queued: whoever learns it arrived ("acked") and then syncs waits for it.
                sender, seq = header[3]
                self._batch_seq[sender] = seq

    def _from_raw(self, raw: list[tuple[str, list[Any], dict[str, str]]], origin: str) -> Batches:
        """A small flush's rows as the proc recorded them -> Arrow, exactly as the proc would have."""
        from rlmesh.telemetry.columnar import rows_to_arrow  # deferred: loaded with the store by the opener

        out = []
        for table, rows, sql_types in raw:
            try:
                out.append(rows_to_arrow(table, rows, self.run_id, sql_types))
            except Exception:  # noqa: BLE001 - these rows are lost, the rest of the message is not
                logger.exception("telemetry: %d %s rows from %s did not convert", len(rows), table, origin)
        return out

    def _first_time(self, key: tuple[str, int]) -> bool:
        """True for a ``(sender id, seq)`` newer than the sender's last batch stored: a batch seen
        before (a replay) is never stored twice. Only the receiving thread reads and marks it."""
        sender, seq = key
        if seq <= self._batch_seq.get(sender, 0):
            self.duplicate_batches += 1
            self._ingest_in.log.replayed(f"telemetry sender {sender}", "batch stored already")
            return False
        return True

    # ---- queries ---------------------------------------------------------------------
    def query(self, sql: str, timeout: float | None = None) -> pa.Table:
        """Read-only SQL on its own cursor (never the writer's lock), stopped at its time limit."""
        return self.store.query(sql, timeout)

    def _query_loop(self) -> None:
        """Receives requests and sends replies; each query runs on a thread of its own (at most
        MAX_QUERIES at once), so one slow query never delays the next, nor a closing proc's ``acked``."""
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        stopping_until = None
        while True:
            if self._stop.is_set():  # answer the queries still in flight (cancelled: the run is ending), then go
                stopping_until = stopping_until or time.monotonic() + 3.0
                if not self._queries or time.monotonic() > stopping_until:
                    break
                self._cancel_queries("the run is ending", wait=0)
            ready = dict(poller.poll(100))
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            self._send_replies()
            if self._router not in ready:
                continue
            ident, *frames = self._router.recv_multipart(copy=False)
            try:
                sid, (kind, payload), _ = wire.decode_session(self._query_in, frames)
            except AuthError:
                continue  # counted, and logged at most once per peer per interval, by the channel
            except Exception:
                logger.warning("telemetry: refused a malformed query")
                continue
            out = self._query_in.reply_outbound(sid)
            if kind == "acked":  # a closing sink asks which of its batches arrived (``payload`` is its id)
                self._reply(ident, out, "ok", self._batch_seq.get(str(payload), 0))  # a number: no pyarrow there
            elif kind == "cancel":  # a query's client stopped waiting (its limit, Ctrl-C): stop the query
                scope = self._queries.get(str(payload))
                if scope is not None:
                    scope.cancel("its client went away")
            elif stopping_until is not None:
                self._reply(ident, out, "error", ("QueryCancelledError", "telemetry query refused: the run is ending"))
            elif len(self._queries) >= MAX_QUERIES:
                self._reply(ident, out, "error", ("ServiceUnavailableError", (
                    f"the telemetry service is running {MAX_QUERIES} queries already; each stops at its time limit "
                    f"({settings.QUERY_TIMEOUT_S.name}); try again shortly")))
            else:
                sql, limit, qid = payload if isinstance(payload, tuple) else (payload, None, None)
                qid = str(qid) if qid else f"anon-{time.monotonic_ns()}"
                scope = self._queries[qid] = limits.Scope()
                threading.Thread(target=self._answer, args=(ident, out, kind, sql, limit, qid, scope),
                                 name="rlmesh-telemetry-query", daemon=True).start()
        self._send_replies()

    def _answer(self, ident: Any, out: Any, kind: str, sql: str, limit: float | None, qid: str,
                scope: limits.Scope) -> None:
        try:
            with scope.active():
                if kind == "sync":
                    self.sync()
                    import pyarrow as pa  # deferred: loaded with the store by the opener (DuckDB needs it)

                    from rlmesh.telemetry import arrays  # deferred: as pyarrow above

                    self._reply(ident, out, "ok", None, [pa.table({"ok": arrays.array([True], pa.bool_())})])
                else:
                    self._reply(ident, out, "ok", None, [self.query(sql, limit)])
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the client, in words
            self._reply(ident, out, "error", (type(exc).__name__, str(exc)))
        finally:
            self._queries.pop(qid, None)

    def _reply(self, ident: Any, out: Any, status: str, payload: Any, tables: list[Any] = ()) -> None:  # type: ignore[assignment]
        """Queue a reply for the query thread (the one thread that may use the ROUTER socket) and wake it."""
        self._replies.put((ident, out, status, payload, tables))
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _send_replies(self) -> None:
        while True:
            try:
                ident, out, status, payload, tables = self._replies.get_nowait()
            except queue.Empty:
                return
            try:
                reply = wire.encode(out, status, payload, tables)
            except Exception as exc:  # noqa: BLE001 - e.g. a result Arrow IPC cannot carry
                reply = wire.encode(out, "error", (type(exc).__name__, str(exc)))
            self._router.send_multipart([ident, *reply], copy=False)

    def _cancel_queries(self, reason: str, wait: float = 5.0) -> None:
        """Stop every query in flight (DuckDB's interrupt) and wait until their threads let go of the file."""
        for scope in list(self._queries.values()):
            scope.cancel(reason)
        give_up = time.monotonic() + wait
        while self._queries and time.monotonic() < give_up:
            time.sleep(0.01)
