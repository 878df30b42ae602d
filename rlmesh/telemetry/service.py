"""The telemetry service: one per run, in the controller process, sole writer of the DuckDB file.

Why in the controller: it is the one process that lives as long as the run, and an
in-process service lets the controller's own rows skip the network. Three threads:

- *writer*: drains the ingest queue within 0.1 s, concatenates batches per table
  and appends them (each append commits, so rows reach the WAL on disk well within
  the one-second durability promise, and survive a SIGKILL of the controller);
- *receiver*: a PULL socket for batches from worker procs (MAC checked first);
- *queries*: a ROUTER socket answering live read-only SQL, so that nobody else
  needs to open the locked file while the run is going.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import zmq

from rlmesh.telemetry import run as runs
from rlmesh.telemetry import arrays, snapshots, wire
from rlmesh.telemetry.schema import SchemaError
from rlmesh.telemetry.store import Store
from rlmesh.telemetry.client import telemetry_context
from rlmesh.transport import AuthError, Authenticator, bind_channel
from rlmesh.transport.sockets import tune

logger = logging.getLogger(__name__)

Batches = list[tuple[str, pa.Table]]
COALESCE_S = 0.1
COALESCE_ROWS = 1_000_000
RUN_JSON_EVERY_S = 5.0


def _rows(item: Any) -> int:
    return sum(t.num_rows for _, t in item[1]) if item else 0


class TelemetryService:
    """Start with :meth:`start`; :meth:`stop` finalises the ``runs`` row and closes the file."""

    def __init__(self, run_dir: Path, run_id: str, auth: Authenticator, config: Any = None, resume: bool = False):
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.auth = auth
        self.store = Store(self.run_dir / runs.DB_NAME, run_id)
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
        self.ingest_addr = self.query_addr = ""
        self._last_recv = 0.0
        self._batch_seq: dict[str, int] = {}  # sender id -> last batch stored (ingest is idempotent)
        self.duplicate_batches = 0
        self._run_json_at = time.monotonic()
        self.resumed = resume and bool(self.store.con.execute(
            "SELECT count(*) FROM runs WHERE id = ?", [run_id]).fetchone()[0])
        if self.resumed:  # a resumed run: the same row goes back to running
            self.store.execute_write("UPDATE runs SET status = 'running', end_ts = NULL, error = NULL, pid = ?, argv = ? "
                                     "WHERE id = ?",
                                     [os.getpid(), " ".join(sys.argv), run_id])
            if config is not None:
                self.set_config(config)
        else:
            self._insert_run_row(config)

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> "TelemetryService":
        ctx = telemetry_context()
        self._pull = tune(ctx.socket(zmq.PULL))
        self._router = tune(ctx.socket(zmq.ROUTER))
        self.ingest_addr, self._ingest_in = bind_channel(self._pull, self.auth, "telemetry ingest")
        self.query_addr, self._query_in = bind_channel(self._router, self.auth, "telemetry queries")
        for name, fn in (("writer", self._write_loop), ("recv", self._recv_loop), ("query", self._query_loop)):
            t = threading.Thread(target=fn, name=f"rlmesh-telemetry-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        info = {"run_id": self.run_id, "ingest_addr": self.ingest_addr, "query_addr": self.query_addr,
                "secret": os.environ.get("RLMESH_SECRET", ""), "pid": os.getpid(), "host": socket.gethostname()}
        runs.write_json(self.run_dir / runs.SERVICE_JSON, info, private=True)
        every = snapshots.interval_from_env()  # Parquet under runs/<run>/live/ for pandas, polars & co.
        self._snap = snapshots.Snapshotter(self.store.con, self.run_dir, every).start() if every else None
        self._write_run_json("running")
        logger.info("telemetry: run %s recording to %s", self.run_id, self.store.path)
        return self

    def stop(self, status: str = "ok", error: str | None = None) -> None:
        """Drain, mark the run finished (``error``: why it failed, kept in ``runs.error``), checkpoint
        and close. Idempotent. The database row is committed before ``run.json`` is rewritten: a
        kill in between is settled from the database (:func:`runs.settle_dead_runs`)."""
        if self._stop.is_set():
            return
        give_up = time.monotonic() + 1.0
        while time.monotonic() - self._last_recv < 0.15 and time.monotonic() < give_up:
            time.sleep(0.02)  # procs that just exited may still have their last batches in flight
        self.sync(timeout=10)
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
        for s in (self._pull, self._router):
            s.close(0)
        logger.info("telemetry: run %s %s; %d rows in %s", self.run_id, status, self.store.rows_written, self.store.path)

    def _insert_run_row(self, config: Any) -> None:
        self.store.execute_write(
            "INSERT INTO runs (run_id, ts, mesh, rank, proc, id, config, start_ts, status, argv, pid, host) "
            "VALUES (?, now(), 'controller', -1, 'controller', ?, ?, to_timestamp(?), 'running', ?, ?, ?)",
            [self.run_id, self.run_id, json.dumps(config, default=str) if config is not None else None,
             self.started, " ".join(sys.argv), os.getpid(), socket.gethostname()],
        )

    def set_config(self, config: Any) -> None:
        self.store.execute_write("UPDATE runs SET config = ? WHERE id = ?",
                                 [json.dumps(config, default=str), self.run_id])

    def _write_run_json(self, status: str, end: float | None = None, error: str | None = None) -> None:
        runs.write_json(self.run_dir / runs.RUN_JSON, {
            "id": self.run_id, "status": status, "start_ts": self.first_started, "end_ts": end,
            "generation_start_ts": self.started, "pid": os.getpid(), "host": socket.gethostname(), "argv": sys.argv,
            "rows": self.rows_before + self.store.rows_written, "error": error,
        })

    # ---- ingest ----------------------------------------------------------------------
    def ingest(self, batches: Batches) -> int:
        """Queue batches for the writer; never blocks on disk. Returns a ticket for :meth:`sync`."""
        if not batches:
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
            while self._written < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def _write_loop(self) -> None:
        while True:
            items = [self._q.get()]
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
            if header[0] == "batches" and len(header) == 4 and self._first_time(header[3]):
                self.ingest(list(zip(header[2], tables)))

    def _first_time(self, key: tuple[str, int]) -> bool:
        """True once per ``(sender id, seq)``: a batch seen before (a replay) is never stored twice."""
        sender, seq = key
        if seq <= self._batch_seq.get(sender, 0):
            self.duplicate_batches += 1
            self._ingest_in.log.replayed(f"telemetry sender {sender}", "batch stored already")
            return False
        self._batch_seq[sender] = seq
        return True

    # ---- queries ---------------------------------------------------------------------
    def query(self, sql: str) -> pa.Table:
        return self.store.query(sql)

    def _query_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            ident, *frames = self._router.recv_multipart(copy=False)
            try:
                sid, (kind, sql), _ = wire.decode_session(self._query_in, frames)
            except AuthError:
                continue  # counted, and logged at most once per peer per interval, by the channel
            except Exception:
                logger.warning("telemetry: refused a malformed query")
                continue
            out = self._query_in.reply_outbound(sid)
            try:
                if kind == "sync":
                    self.sync()
                    result = pa.table({"ok": arrays.array([True], pa.bool_())})  # no pandas (telemetry.arrays)
                elif kind == "acked":  # a closing sink asks which of its batches arrived (``sql`` is its id)
                    result = pa.table({"seq": arrays.array([self._batch_seq.get(str(sql), 0)], pa.int64())})
                else:
                    result = self.query(sql)
                reply = wire.encode(out, "ok", None, [result])
            except Exception as exc:
                reply = wire.encode(out, "error", (type(exc).__name__, str(exc)))
            self._router.send_multipart([ident, *reply], copy=False)
