"""The DuckDB file of one run: built-in tables, schema checks, Arrow appends, read-only SQL.

Only the telemetry service writes to the file (one writer, so no lock conflicts).
Appends go through DuckDB's Arrow scan, ``INSERT INTO t BY NAME SELECT * FROM batch``,
which is the fastest bulk path DuckDB has from Python; ``BY NAME`` lets batches carry
any subset of the columns in any order.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from rlmesh.telemetry import durability, limits, schema
from rlmesh.telemetry.schema import qident
from rlmesh.telemetry.columnar import REJECTED, rejected_batch
from rlmesh.telemetry.errors import ReadOnlyQueryError

logger = logging.getLogger(__name__)

#: On-disk format the run files are written in: DuckDB >= 1.1 opens them (the default of DuckDB 2.x,
#: storage version "999", is refused by DuckDB 1.1.x: "version number 999, but we can only read version 64").
STORAGE_COMPAT = "v1.1.0"
_CANON = {"TIMESTAMPTZ": "TIMESTAMP WITH TIME ZONE", "INT64": "BIGINT", "FLOAT8": "DOUBLE"}
# Lossless widenings accepted without complaint: batch type -> table types it may enter.
_WIDEN = {
    "INTEGER": {"BIGINT", "DOUBLE"}, "SMALLINT": {"INTEGER", "BIGINT", "DOUBLE"},
    "TINYINT": {"SMALLINT", "INTEGER", "BIGINT", "DOUBLE"}, "BIGINT": {"DOUBLE"},
    "FLOAT": {"DOUBLE"}, "VARCHAR": {"JSON"},
}
REJECTED_DDL = (f'CREATE TABLE IF NOT EXISTS "{REJECTED}" '
                "(run_id VARCHAR, ts TIMESTAMPTZ DEFAULT current_timestamp, table_name VARCHAR, reason VARCHAR, row VARCHAR)")


def canon(sql_type: str) -> str:
    t = str(sql_type).strip()
    return _CANON.get(t.upper(), t)


def lock_down(con: Any) -> None:
    """Close this DuckDB *database* (every connection to it, the writer's too) to the outside, for good.

    ``enable_external_access=false``: no file is read or written through SQL (``COPY ... TO``,
    ``read_csv``, ``ATTACH`` of a file, ``EXPORT DATABASE``, extension installs, Python
    replacement scans); ``lock_configuration=true``: no statement can turn that back on. DuckDB
    enforces both, whatever the statement's shape (``EXPLAIN ANALYZE COPY ...`` included).
    """
    if _locked(con):
        return
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _locked(con: Any) -> bool:
    row = con.execute("SELECT current_setting('lock_configuration'), current_setting('enable_external_access')").fetchall()[0]
    return bool(row[0]) and not bool(row[1])


def statements(sql: str) -> list[Any]:
    """DuckDB's own split of ``sql`` into statements (a parse error is a :class:`duckdb.ParserException`)."""
    try:
        stmts = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise duckdb.ParserException(f"cannot parse telemetry query: {exc}") from exc
    if not stmts:
        raise ValueError("empty telemetry query; try: SELECT * FROM runs")
    return stmts


def execute_read_only(con: Any, sql: str, catalog: str | None = None, timeout: float | None = None) -> pa.Table:
    """THE read path of every telemetry query (live or finished, CLI, API, agents): the result of
    the last statement of ``sql``, as a pyarrow Table.

    Read-only by DuckDB's own means, not by guessing from the statement's text: the database
    is locked down (:func:`lock_down`), and each statement runs alone in its own
    ``BEGIN TRANSACTION READ ONLY`` on a fresh cursor, rolled back after, so a ``COMMIT``
    inside ``sql`` cannot leave the next statement outside a read-only transaction.
    ``catalog``: the attached database that unqualified names mean (see :func:`open_read_only`).
    ``timeout``: the time limit in seconds (default ``RLMESH_QUERY_TIMEOUT_S``); past it, or when the
    query's scope is cancelled (:mod:`rlmesh.telemetry.limits`), DuckDB's own interrupt stops it and
    :class:`~rlmesh.telemetry.limits.QueryTimeoutError` (or ``QueryCancelledError``) is raised.
    """
    stmts = statements(sql)
    limit = limits.limit_for(timeout)
    cur = con.cursor()
    try:
        with limits.guarded(limit, cur.interrupt) as guard:
            try:
                lock_down(cur)  # global settings: a no-op on a database that is already locked down
                if catalog is not None:
                    cur.execute(f"USE {qident(catalog)}")  # per connection: a cursor does not inherit it
                out = None
                for st in stmts:
                    if guard.fired is not None:  # fired between two statements: nothing running to interrupt
                        raise guard.error()
                    out = _run_read_only(cur, st)
                return out if out is not None else pa.table({})
            except duckdb.Error as exc:
                if guard.fired is not None:  # DuckDB's "Interrupted!": say why, and what to change
                    raise guard.error() from exc
                raise
    finally:
        cur.close()


# DuckDB's words when it refuses a write, a file or a setting (read-only transaction or database, lock-down).
_REFUSED = ("read-only", "read only", "file system operations are disabled", "configuration has been locked",
            "disabled by configuration")


def _run_read_only(cur: Any, st: Any) -> pa.Table | None:
    cur.execute("BEGIN TRANSACTION READ ONLY")
    try:
        rel = cur.sql(st.query)
        return rel.to_arrow_table() if rel is not None else None
    except duckdb.Error as exc:
        if any(w in str(exc) for w in _REFUSED):
            kind = str(st.type).rsplit(".", 1)[-1]
            raise ReadOnlyQueryError(
                f"telemetry queries are read-only: a {kind} statement was refused ({st.query.strip()[:60]!r}; "
                f"DuckDB: {str(exc).splitlines()[0]}). Use SELECT/WITH/DESCRIBE/SHOW/SUMMARIZE/EXPLAIN; to change "
                "data, copy runs/<run>/telemetry.duckdb after the run and open the copy with duckdb."
            ) from exc
        raise
    finally:
        try:
            cur.rollback()
        except duckdb.Error:
            pass  # the statement was itself a COMMIT or ROLLBACK (nothing left open), or it was interrupted


def open_read_only(dbs: dict[str, Path]) -> Any:
    """A fresh in-memory DuckDB with each file of ``dbs`` attached ``READ_ONLY`` under its alias,
    then locked down: nothing else can be attached. Pass the alias meant by unqualified names
    as ``catalog`` to :func:`execute_read_only`.

    This is how several runs are queried side by side without ATTACH being open to any path.
    Raises ``duckdb.IOException`` (lock held by a live writer, not a DuckDB file) as DuckDB does.
    """
    con = duckdb.connect(":memory:")
    try:
        for alias, path in dbs.items():
            lit = "'" + str(path).replace("'", "''") + "'"
            con.execute(f"ATTACH {lit} AS {qident(alias)} (READ_ONLY)")
        lock_down(con)
    except BaseException:
        con.close()
        raise
    return con


def _connect_rw(path: Path) -> duckdb.DuckDBPyConnection:
    """The writer's connection; a log DuckDB refuses (a damaged entry) is copied aside and cut there first."""
    config: dict[str, str | bool | int | float | list[str]] = {"storage_compatibility_version": STORAGE_COMPAT}
    try:
        return duckdb.connect(str(path), config=config)
    except duckdb.Error as exc:
        if not durability.repair(path, exc):
            raise
    return duckdb.connect(str(path), config=config)


@dataclass(frozen=True)
class WriteMarks:
    """How many writes the store has made so far: appends per table, and everything else (DDL, the ``runs``
    row, rejected rows), which may touch any table. Two equal marks mean nothing was written in between:
    the Parquet snapshotter visits only the tables whose count moved."""

    other: int = 0
    appends: dict[str, int] = field(default_factory=dict)


class Store:
    """Owns the run's DuckDB connection in the service (writer) process."""

    def __init__(self, path: Path, run_id: str):
        self.path = Path(path)
        self.run_id = run_id
        existed = self.path.exists()
        # Before the read-write open folds the log into the file (and deletes it): did it replay whole?
        self.lost_rows_note = durability.check(self.path) if existed else None
        durability.report(self.lost_rows_note)
        self.con = _connect_rw(self.path)
        self._wal = self.path.with_name(self.path.name + ".wal")
        self._lock = threading.Lock()  # serialises writers on self.con
        self._cols: dict[str, dict[str, str]] = {}
        self._accepted: dict[str, pa.Schema] = {}  # per table, the last batch schema that passed the check
        self._appends: dict[str, int] = {}
        self._other_writes = 0
        self.rows_written = 0
        self.rejected_rows = 0
        for t in schema.BUILTIN.values():
            self.con.execute(schema.builtin_ddl(t))
            for c in t.columns:  # a database from an older rlmesh (a resumed run) gains newer columns
                self.con.execute(f"ALTER TABLE {qident(t.name)} ADD COLUMN IF NOT EXISTS {qident(c.name)} {c.type}")
        self.con.execute(REJECTED_DDL)
        for name, sql in schema.VIEW_SQL.items():
            self.con.execute(f"CREATE OR REPLACE VIEW {qident(name)} AS {sql}")
        self._private()
        # DuckDB turns its progress bar on for the first connection of a `python -c` program: a checkpoint or
        # an append slower than 2 s (a loaded host) would print one into the user's stdout
        self.con.execute("SET enable_progress_bar = false")
        lock_down(self.con)  # before any query can reach it; the writer needs no files either
        self._load_columns()
        # Rows per table now in the file: what the sidecar says was committed (durability.check)
        self._committed = durability.counts(self.con) if existed else {}
        self._committed_saved: dict[str, int] | None = None
        self.save_committed()

    def _load_columns(self) -> None:
        self._cols.clear()
        for table, col, typ in self.con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"
        ).fetchall():
            self._cols.setdefault(table, {})[col] = canon(typ)

    def columns(self) -> dict[str, dict[str, str]]:
        return {t: dict(c) for t, c in self._cols.items()}

    def append(self, table: str, batch: pa.Table) -> int:
        """Append one Arrow batch; a mismatched type raises :class:`schema.SchemaError` and keeps the rows in ``_rejected``."""
        if batch.num_rows == 0:
            return 0
        null_cols = [f.name for f in batch.schema if pa.types.is_null(f.type)]
        if null_cols:  # no type to learn from yet: BY NAME fills NULL
            batch = batch.drop_columns(null_cols)
        with self._lock:
            self.con.register("__rlmesh_batch", batch)
            try:
                # The schema check reads the batch's DuckDB types through a relation (~1 ms, a quarter of
                # a small append); a table's columns only grow, so a schema that passed once passes again.
                if self._accepted.get(table) != batch.schema:
                    rel = self.con.table("__rlmesh_batch")
                    types = dict(zip(rel.columns, (canon(t) for t in rel.types)))  # type: ignore[arg-type]  # a DuckDBPyType prints as its SQL name
                    try:
                        self._ensure_schema(table, types)
                    except schema.SchemaError as exc:
                        self._reject(table, str(exc), batch)
                        raise
                    self._accepted[table] = batch.schema
                self.con.execute(f"INSERT INTO {qident(table)} BY NAME SELECT * FROM __rlmesh_batch")
            finally:
                self.con.unregister("__rlmesh_batch")
            self._private()
            self._appends[table] = self._appends.get(table, 0) + 1
            self._committed[table] = self._committed.get(table, 0) + batch.num_rows
        self.rows_written += batch.num_rows
        return batch.num_rows

    def _private(self) -> None:
        """Database and WAL readable by their owner only (0600). DuckDB creates them with the umask
        and recreates the WAL after each checkpoint, so this looks again after each append (a stat)."""
        for p in (self.path, self._wal):
            try:
                if os.stat(p).st_mode & 0o077:
                    os.chmod(p, 0o600)
            except FileNotFoundError:
                pass

    def _ensure_schema(self, table: str, types: dict[str, str]) -> None:
        known = self._cols.get(table)
        if known is None:
            cols = ", ".join(f"{qident(c)} {t}" for c, t in types.items())
            self.con.execute(f"CREATE TABLE IF NOT EXISTS {qident(table)} ({cols})")
            self._cols[table] = dict(types)
            logger.info("telemetry: created table %s (%s)", table, cols)
            return
        for col, typ in types.items():
            have = known.get(col)
            if have is None:
                self.con.execute(f"ALTER TABLE {qident(table)} ADD COLUMN {qident(col)} {typ}")
                known[col] = typ
            elif have != typ and have not in _WIDEN.get(typ, ()):
                raise schema.SchemaError(table, col, have, typ)

    def _reject(self, table: str, reason: str, batch: pa.Table) -> None:
        logger.error("telemetry: %s; %d rows kept in %s", reason, batch.num_rows, REJECTED)
        rows = rejected_batch(table, reason, batch.to_pylist(), self.run_id)
        self.con.register("__rlmesh_rej", rows)
        try:
            self.con.execute(f'INSERT INTO "{REJECTED}" BY NAME SELECT * FROM __rlmesh_rej')
        finally:
            self.con.unregister("__rlmesh_rej")
        self._other_writes += 1
        self.rejected_rows += batch.num_rows
        self._committed[REJECTED] = self._committed.get(REJECTED, 0) + batch.num_rows

    def execute_write(self, sql: str, params: list[Any] | None = None) -> None:
        """Framework-internal writes (the ``runs`` row); never reachable from the query API."""
        with self._lock:
            self.con.execute(sql, params or [])
            self._other_writes += 1

    def write_marks(self) -> WriteMarks:
        """Where the store's writes stand now (see :class:`WriteMarks`)."""
        with self._lock:
            return WriteMarks(self._other_writes, dict(self._appends))

    def query(self, sql: str, timeout: float | None = None) -> pa.Table:
        """Read-only SQL on its own cursor: it never holds the writer's lock, and stops at its time limit."""
        return execute_read_only(self.con, sql, timeout=timeout)

    def save_committed(self, clean: bool = False) -> None:
        """Rewrite the sidecar of committed row counts (after a commit; a no-op when nothing changed)."""
        with self._lock:
            rows = dict(self._committed)
        if rows == self._committed_saved and not clean:
            return
        try:
            durability.write(self.path, rows, note=self.lost_rows_note, clean=clean)
            self._committed_saved = rows
        except OSError as exc:  # a full disk: the writes themselves fail and say so; this is the check's record
            logger.debug("telemetry: could not write %s: %s", durability.sidecar(self.path), exc)

    def checkpoint(self) -> bool:
        """Fold the write-ahead log into the file: what a torn log can cost ends here. False when DuckDB
        refuses for now because another transaction is open (a live query's cursor): nothing is lost,
        the rows stay in the log, and the caller tries again later."""
        with self._lock:
            try:
                self.con.execute("CHECKPOINT")
            except duckdb.TransactionException:
                return False
            self._private()
        return True

    def close(self) -> None:
        with self._lock:
            try:
                self.con.execute("CHECKPOINT")
            finally:
                self.con.close()
        self.save_committed(clean=True)
