"""The per-process row buffer behind ``record()``: cheap in the caller, columnar on the wire.

Why this shape: ``record()`` is called from hot loops (per rollout, per token batch),
so the caller only appends one tuple to a ``deque`` (thread-safe, no lock). A background
thread wakes every ``flush_interval`` seconds, groups the rows by table, checks their
value types column by column against what this proc knows of each table (one pass over a
column's types, not a check per field per row in the caller), turns them into Arrow
tables (one typed array per column) and hands them to a *sink*: the in-process service
in the controller, a zmq socket in a worker. Neither disk nor network is ever touched
on the caller's thread.

A row whose value does not fit its column is refused at that check: it goes to
``_rejected`` with the reason (nothing vanishes), the other rows of the flush are stored,
the :class:`~rlmesh.telemetry.schema.SchemaError` is logged, and it is raised in the caller
by the next ``record()`` into that table (or by ``rm.telemetry.flush()``), whichever comes first.
"""

from __future__ import annotations

import collections
import functools
import logging
import operator
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from rlmesh.actor.context import current_context, current_context_var, current_proc
from rlmesh.telemetry import schema
from rlmesh.telemetry.wire import RawRows, columns_of
from rlmesh.telemetry.config import flush_interval_from_env

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

logger = logging.getLogger(__name__)

_NONE_T = type(None)
# python types that may go into a column of each SQL type without any check beyond `type(v) in ...`
_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    "VARCHAR": (str,),
    "JSON": (str, dict, list),
    "BIGINT": (int,),
    "DOUBLE": (float, int),
    "BOOLEAN": (bool,),
    "TIMESTAMPTZ": (float, int),
    "BLOB": (bytes,),
}
_FAST_TYPES: dict[str, frozenset[type]] = {t: frozenset({_NONE_T, *types}) for t, types in _PLAIN_TYPES.items()}
_EMPTY: frozenset[type] = frozenset({_NONE_T})
_now = time.time
_context = current_context_var.get  # current_context() without its Python frame, once per row
_FIRST, _SECOND, _THIRD, _FOURTH = (operator.itemgetter(i) for i in range(4))
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


@dataclass
class _Part:
    """One table's plain rows of a flush, as parallel lists (stamps, origins, the rows), and, once
    screened, their columns (:func:`~rlmesh.telemetry.wire.columns_of`)."""

    stamps: list[float]
    metas: list[tuple[str, int, str, str]]
    dicts: list[dict[str, Any]]
    columns: tuple[list[str], list[list[Any]]] = ([], [])


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
        self._ready: dict[str, bool] = {}  # tables record() may queue into with no further ado
        self._refused: dict[str, schema.SchemaError] = {}  # table -> a refusal not yet raised in a caller
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
        """Queue ``row`` (no I/O, no per-field work); its types are checked on the flush thread.

        Raises :class:`~rlmesh.telemetry.schema.SchemaError` if an earlier row of ``table`` was
        refused since the last raise (see the module's docstring; this call's row is queued all the
        same), ``ValueError`` for a bad name (nothing queued).
        """
        if table not in self._ready:
            self._admit(table, row)
            return
        q = self._q
        q.append((table, _now(), _context(), row))
        if len(q) % EARLY_FLUSH_ROWS == 0:  # a hot loop: convert in bigger-than-tick chunks, bound memory
            self._wake.set()  # once per chunk: a wake per row, until the flush thread runs, cost 0.5 µs each

    def _admit(self, table: str, row: dict[str, Any]) -> None:
        """record()'s slow path: a table's first row (its name checked), or a refusal to raise after
        queuing ``row`` (which is checked at the flush like any other: the refusal is an earlier row's)."""
        if table not in self._fast:
            self._learn_table(table)
        self._q.append((table, _now(), _context(), row))
        err = self._refused.pop(table, None)
        if err is not None:
            raise err
        self._ready[table] = True

    def raise_refused(self) -> None:
        """Raise the first refusal of a row not yet raised in a caller (``rm.telemetry.flush()`` calls it)."""
        for table in list(self._refused):
            err = self._refused.pop(table, None)
            if err is not None:
                raise err

    def record_trusted(self, table: str, row: dict[str, Any], ts: float | None = None) -> None:
        """Queue a framework row (span, health sample, lifecycle event): no name check; its types are checked at the flush like any row's."""
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

    def _screen(self, table: str, part: _Part) -> list[tuple[str, Any]]:
        """Drop from ``part`` the rows that do not fit ``table``'s column types; returns them as
        ``_rejected`` batches (see ``_refuse``).

        One pass over each column's value types (a set of types per column, at C speed); only a
        column whose set holds a type not yet seen in it is looked at value by value. A new column
        takes its type from its first value, in the order the rows were recorded.
        """
        fast = self._fast[table]
        keys, values = part.columns = columns_of(part.dicts)
        bad: dict[int, schema.SchemaError] = {}
        for k, vals in zip(keys, values):
            ok = fast.get(k)
            if ok is not None and set(map(type, vals)) <= ok:
                continue
            for i, v in enumerate(vals):
                if v is None or type(v) in fast.get(k, _EMPTY) or i in bad:
                    continue
                err = self._check_value(table, k, v)
                if err is not None:
                    bad[i] = err
        if not bad:
            return []
        rejected = self._refuse(table, [(part.metas[i], part.dicts[i], e) for i, e in bad.items()])
        keep = [i for i in range(len(part.dicts)) if i not in bad]
        part.stamps = [part.stamps[i] for i in keep]
        part.metas = [part.metas[i] for i in keep]
        part.dicts = [part.dicts[i] for i in keep]
        part.columns = columns_of(part.dicts) if part.dicts else ([], [])
        return rejected

    def _check_value(self, table: str, column: str, value: Any) -> schema.SchemaError | None:
        """Whether ``value`` fits the column (learning a new column's type, or a new Python type
        of a known kind, such as ``numpy.float32`` into DOUBLE); the error if it does not."""
        kind = schema.kind_of(value)
        if kind.startswith("unsupported:"):
            return schema.SchemaError(
                table, column, self._sql[table].get(column, "(new column)"), kind.split(":", 1)[1],
                hint="record plain numbers, strings, bools, bytes, datetimes, lists or dicts "
                "(call .item() on numpy/torch scalars)",
            )
        known = self._sql[table].get(column)
        if known is None:  # a new column: its first value decides its type
            sql_t = schema.sql_type_of_kind(kind)
            self._sql[table][column] = sql_t
            self._fast[table][column] = _FAST_TYPES.get(sql_t, _EMPTY) | {type(value)}
            return None
        if not schema.fits(known, kind):
            return schema.SchemaError(table, column, known, schema.sql_type_of_kind(kind))
        self._fast[table][column] = self._fast[table].get(column, _EMPTY) | {type(value)}
        return None

    def _refuse(self, table: str, refused: list[tuple[tuple[str, int, str, str], dict[str, Any], schema.SchemaError]]) -> list[Any]:
        """Refused rows as ``_rejected`` batches (the reason names who recorded them); the error is
        logged, and left for the caller's next ``record()`` into ``table`` (or ``flush()``) to raise."""
        by_reason: dict[str, list[dict[str, Any]]] = {}
        first: schema.SchemaError | None = None
        for meta, row, err in refused:
            err = err.recorded_by(f"{meta[0]}[{meta[1]}]" if meta[1] >= 0 else meta[0])
            by_reason.setdefault(f"column {err.column!r}: {err}", []).append(row)
            first = first or err
        out = []
        for reason, rows in by_reason.items():
            logger.error("telemetry: %d row(s) refused, kept in %s: %s", len(rows), _columnar().REJECTED, reason)
            out.append((_columnar().REJECTED, _columnar().rejected_batch(table, reason, rows, self.run_id)))
        if first is not None:
            self._refused.setdefault(table, first)
            self._ready.pop(table, None)
        return out

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

    def _convert(self, items: list[tuple[Any, ...]], raw: bool = False) -> list[tuple[str, Any]]:
        """Group ``items`` by table, as Arrow tables (``raw``: plain rows as :class:`RawRows` instead).

        pyarrow and numpy (~0.1 s of CPU) are loaded here, on the flush thread, the first time a
        flush needs Arrow: a proc reaches its first call without them, and one that records only
        small flushes never loads them (issue 16).
        """
        order = self._one_table(items)
        if order is None:
            order = self._group(items)
        out: list[tuple[str, Any]] = []
        for table, payload in order:
            if isinstance(payload, _Part):
                if table not in self._sql:  # a framework table's first rows (record_trusted)
                    self._learn_table(table)
                out += self._screen(table, payload)
                if not payload.dicts:
                    continue
                if raw:
                    rows = list(zip(payload.stamps, payload.metas, payload.dicts))
                    out.append((table, RawRows(rows, dict(self._sql[table]))))
                    continue
                out.append(_columnar().columns_to_arrow(table, payload.stamps, payload.metas, payload.dicts,
                                                        payload.columns, self.run_id, self._sql[table]))
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

    def _one_table(self, items: list[tuple[Any, ...]]) -> list[tuple[str, Any]] | None:
        """A flush of plain rows of one table (a hot loop's): grouped with no Python loop per row."""
        tables = list(map(_FIRST, items))  # not zip(*items): an iterator per row would wake the collector
        t0, n = tables[0], len(items)
        if t0 is None or tables.count(t0) != n:
            return None
        ctxs = list(map(_THIRD, items))
        c0 = ctxs[0]
        metas = [self._meta_of(c0)] * n if ctxs.count(c0) == n else list(map(self._meta_of, ctxs))
        return [(t0, _Part(list(map(_SECOND, items)), metas, list(map(_FOURTH, items))))]

    def _group(self, items: list[tuple[Any, ...]]) -> list[tuple[str, Any]]:
        """``[(table, _Part | _Items | Arrow table)]``: rows grouped by table, in batch and row order."""
        by_table: dict[str, _Part] = {}
        lazy: dict[tuple[str, Any], _Items] = {}
        order: list[tuple[str, Any]] = []
        last_ctx, meta = _NONE_T, self._default_meta  # rows in a row from one actor: one lookup
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
            part = by_table.get(table)
            if part is None:
                part = by_table[table] = _Part([], [], [])
                order.append((table, part))
            if ctx is not last_ctx:
                last_ctx, meta = ctx, self._meta_of(ctx)
            part.stamps.append(ts)  # three lists, not a tuple per row: no new object per row
            part.metas.append(meta)
            part.dicts.append(row)
        return order

    @property
    def _default_meta(self) -> tuple[str, int, str, str]:
        """Origin of rows recorded outside an actor: this worker proc, or the controller."""
        if self._proc_meta is None:
            host = self._host or socket.gethostname()
            self._host = host  # asked once: it cost ~2 µs per row of the controller's own rows
            proc = current_proc()
            if proc is None:
                return self._controller_meta(host)
            self._proc_meta = (proc.proc_mesh, proc.rank, proc.proc_id, proc.host or host)
        return self._proc_meta

    @staticmethod
    @functools.lru_cache(maxsize=4)
    def _controller_meta(host: str) -> tuple[str, int, str, str]:
        """One tuple for the controller's rows (not cached as ``_proc_meta``: a fork may become a worker)."""
        return ("controller", -1, "controller", host)

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
