"""The per-process row buffer behind ``record()``: cheap in the caller, columnar on the wire.

Why this shape: ``record()`` is called from hot loops (per rollout, per token batch),
so the caller only checks value types against what it already knows of the table and
appends one tuple to a ``deque`` (thread-safe, no lock). A background thread wakes
every ``flush_interval`` seconds, groups the rows by table, turns them into Arrow
tables (one typed array per column) and hands them to a *sink*: the in-process service
in the controller, a zmq socket in a worker. Neither disk nor network is ever touched
on the caller's thread.
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from rlmesh.actor.context import current_context, current_proc
from rlmesh.telemetry import schema
from rlmesh.telemetry.wire import RawRows
from rlmesh.telemetry.config import flush_interval_from_env

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

logger = logging.getLogger(__name__)

# python types that may go into a column of each SQL type without any check beyond `type(v) in ...`
_FAST_TYPES: dict[str, frozenset[type]] = {
    "VARCHAR": frozenset({str}),
    "JSON": frozenset({str, dict, list}),
    "BIGINT": frozenset({int}),
    "DOUBLE": frozenset({float, int}),
    "BOOLEAN": frozenset({bool}),
    "TIMESTAMPTZ": frozenset({float, int}),
    "BLOB": frozenset({bytes}),
}
_NONE_T = type(None)
_EMPTY: frozenset[type] = frozenset()
EARLY_FLUSH_ROWS = 50_000

Sink = Callable[[list[tuple[str, Any]]], None]


def _columnar() -> Any:
    """:mod:`rlmesh.telemetry.columnar`, loaded by the first flush that needs Arrow (see ``_convert``)."""
    from rlmesh.telemetry import columnar  # deferred: pyarrow + numpy, ~0.1 s of CPU, off a proc's start

    return columnar


@dataclass
class _Items:
    """Queued framework items of one table and the function that makes them one Arrow table."""

    items: list[Any]
    to_table: Callable[[list[Any]], pa.Table]


class Recorder:
    """Buffers rows of one process and ships them, as Arrow batches, to ``sink``.

    ``sink(batches)`` receives ``[(table, pyarrow.Table), ...]`` on the flush thread;
    it must not block for long (the remote sink queues, the local one enqueues).
    """

    def __init__(self, run_id: str, sink: Sink, flush_interval: float | None = None, raw_max_rows: int = 0):
        self.run_id = run_id
        self._sink = sink
        self.raw_max_rows = raw_max_rows
        """A flush of at most this many plain rows goes to the sink as :class:`RawRows` (0: never)."""
        self.flush_interval = flush_interval_from_env() if flush_interval is None else flush_interval
        self._q: collections.deque[tuple[Any, ...]] = collections.deque()
        self._sql: dict[str, dict[str, str]] = {}  # table -> column -> SQL type, as this proc knows it
        self._fast: dict[str, dict[str, frozenset[type]]] = {}
        self._meta: dict[int, tuple[Any, tuple[str, int, str, str]]] = {}
        self._lock = threading.Lock()  # one converter at a time (flush thread or flush())
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.rows_recorded = 0
        self.last_ticket = 0  # the local sink's receipt for the newest batch (see TelemetryService.sync)
        self._proc_meta: tuple[str, int, str, str] | None = None
        self._host = ""
        self._thread = threading.Thread(target=self._loop, name="rlmesh-telemetry-flush", daemon=True)
        self._thread.start()

    # ---- caller side -------------------------------------------------------------
    def record(self, table: str, row: dict[str, Any]) -> None:
        """Check ``row`` against the table's known column types, then queue it (no I/O)."""
        fast = self._fast.get(table)
        if fast is None:
            fast = self._learn_table(table)
        for k, v in row.items():
            if type(v) not in fast.get(k, _EMPTY) and v is not None:
                self._check_slow(table, k, v)
        q = self._q
        q.append((table, time.time(), current_context(), row))
        if len(q) > EARLY_FLUSH_ROWS:  # a hot loop: convert in bigger-than-tick chunks, bound memory
            self._wake.set()

    def record_trusted(self, table: str, row: dict[str, Any], ts: float | None = None) -> None:
        """Queue a framework row (span, health sample, lifecycle event) without type checks."""
        self._q.append((table, time.time() if ts is None else ts, None, row))

    def record_batch(self, table: str, data: Any) -> None:
        """Queue a whole columnar batch (pyarrow Table, or dict of column -> sequence/array)."""
        import pyarrow as pa  # deferred: the one record call that needs pyarrow at once (see _convert)

        tbl = data if isinstance(data, pa.Table) else pa.table(data)
        self._learn_table(table)
        self._q.append((None, time.time(), current_context(), (table, tbl)))
        self._wake.set()  # a batch is already columnar: ship it now rather than at the next tick

    def record_trusted_items(self, table: str, items: list[Any], to_table: Callable[[list[Any]], pa.Table]) -> None:
        """Queue framework items that ``to_table`` turns into one columnar batch on the flush thread.

        For frequent small lists (a proc's output lines, one list per read of its pipe): the
        caller pays a deque append, and every list of one tick becomes one table (``to_table``
        gets them all at once; the table carries its own ``ts``/``mesh``/``rank``/``proc``/``host``).
        """
        self._q.append((None, 0.0, None, (table, _Items(items, to_table))))

    def _learn_table(self, table: str) -> dict[str, frozenset[type]]:
        if table not in self._fast:
            schema.check_table_name(table)
        decl = schema.BUILTIN.get(table)
        sql = {c.name: c.type for c in schema.AUTO}
        if decl:
            sql.update({c.name: c.type for c in decl.columns})
        self._sql.setdefault(table, sql)
        fast = self._fast.setdefault(table, {k: _FAST_TYPES.get(t, _EMPTY) for k, t in sql.items()})
        return fast

    def _check_slow(self, table: str, column: str, value: Any) -> None:
        kind = schema.kind_of(value)
        if kind.startswith("unsupported:"):
            raise schema.SchemaError(
                table, column, self._sql[table].get(column, "(new column)"), kind.split(":", 1)[1],
                hint="record plain numbers, strings, bools, bytes, datetimes, lists or dicts "
                "(call .item() on numpy/torch scalars)",
            )
        known = self._sql[table].get(column)
        if known is None:  # a new column: its first value decides its type
            sql_t = schema.sql_type_of_kind(kind)
            self._sql[table][column] = sql_t
            self._fast[table][column] = _FAST_TYPES.get(sql_t, _EMPTY)
            return
        if not schema.fits(known, kind):
            raise schema.SchemaError(table, column, known, schema.sql_type_of_kind(kind))
        if kind != "none":  # e.g. numpy.float32 into DOUBLE: fine, and fast from now on
            self._fast[table][column] = self._fast[table][column] | {type(value)}

    # ---- flush side --------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # never kill the thread: the next tick retries
                logger.exception("telemetry flush failed")

    def flush(self) -> int:
        """Convert and hand every queued row to the sink now; returns the number of rows shipped."""
        with self._lock:
            n = len(self._q)
            if not n:
                self._sink([])  # lets a remote sink retry its backlog
                return 0
            items = [self._q.popleft() for _ in range(n)]
            batches = self._convert(items, raw=n <= self.raw_max_rows)
            self.rows_recorded += sum(t.num_rows for _, t in batches)
            self.last_ticket = self._sink(batches) or self.last_ticket
            return n

    def _convert(self, items: Iterable[tuple[Any, ...]], raw: bool = False) -> list[tuple[str, Any]]:
        """Group ``items`` by table, as Arrow tables (``raw``: plain rows as :class:`RawRows` instead).

        pyarrow and numpy (~0.1 s of CPU) are loaded here, on the flush thread, the first time a
        flush needs Arrow: a proc reaches its first call without them, and one that records only
        small flushes never loads them (issue 16).
        """
        by_table: dict[str, list[tuple[float, Any, dict[str, Any]]]] = {}
        lazy: dict[tuple[str, Any], _Items] = {}
        order: list[tuple[str, Any]] = []  # keeps batch and row order per table
        for table, ts, ctx, row in items:
            if table is None:  # a columnar batch, or items that become one
                name, tbl = row
                if isinstance(tbl, _Items):
                    acc = lazy.get((name, tbl.to_table))
                    if acc is None:
                        acc = lazy[(name, tbl.to_table)] = _Items([], tbl.to_table)
                        order.append((name, acc))
                    acc.items.extend(tbl.items)
                    continue
                order.append((name, _columnar().with_auto_columns(tbl, self.run_id, ts, self._meta_of(ctx))))
                continue
            rows = by_table.get(table)
            if rows is None:
                rows = by_table[table] = []
                order.append((table, rows))
            rows.append((ts, self._meta_of(ctx), row))
        out = []
        for table, payload in order:
            if isinstance(payload, list):
                if table not in self._sql:  # trusted rows skip record()'s check, not the declared types
                    self._learn_table(table)
                if raw:
                    out.append((table, RawRows(payload, dict(self._sql[table]))))
                    continue
                out.append(_columnar().rows_to_arrow(table, payload, self.run_id, self._sql[table]))
            elif isinstance(payload, _Items):
                try:
                    if payload.items:
                        tbl = payload.to_table(payload.items)
                        out.append((table, _columnar().with_auto_columns(tbl, self.run_id, 0.0, self._default_meta)))
                except Exception:  # noqa: BLE001 - these items are lost, the tick's other rows are not
                    logger.exception("telemetry: %d %s items did not convert", len(payload.items), table)
            else:
                out.append((table, payload))
        return out

    @property
    def _default_meta(self) -> tuple[str, int, str, str]:
        """Origin of rows recorded outside an actor: this worker proc, or the controller."""
        if self._proc_meta is None:
            host = self._host or socket.gethostname()
            self._host = host  # asked once: it cost ~2 µs per row of the controller's own rows
            proc = current_proc()
            if proc is None:
                return ("controller", -1, "controller", host)
            self._proc_meta = (proc.proc_mesh, proc.rank, proc.proc_id, proc.host or host)
        return self._proc_meta

    def _meta_of(self, ctx: Any) -> tuple[str, int, str, str]:
        if ctx is None:
            return self._default_meta
        hit = self._meta.get(id(ctx))
        if hit is not None and hit[0] is ctx:
            return hit[1]
        meta = (ctx.mesh_name, ctx.rank, ctx.proc.proc_id, ctx.proc.host or self._default_meta[3])
        if len(self._meta) > 4096:
            self._meta.clear()
        self._meta[id(ctx)] = (ctx, meta)
        return meta

    def close(self, timeout: float = 5.0) -> None:
        """Stop the flush thread after a last flush (called at exit)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        try:
            self.flush()
        except Exception:
            logger.exception("final telemetry flush failed")
