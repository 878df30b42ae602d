"""``query(sql, run=...)``: THE read path of telemetry, for people, programs and agents.

Every reader goes through :func:`query` (``rm.telemetry.query``; ``rlmesh sql``, ``rlmesh plot``,
the dashboard and agent interfaces call it too): the same SQL on a live run (through its
service) and a finished one (the file), and several finished runs side by side.

Why through the service while live: DuckDB lets one process open a file read-write
and then nobody else may open it, not even read-only. The service already holds the
file, so it answers; after the run the file is attached ``READ_ONLY``. Either way the
database refuses writes, files and setting changes itself (see
:func:`rlmesh.telemetry.store.execute_read_only`); no statement text is trusted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from rlmesh import settings
from rlmesh.telemetry import api, durability, limits
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.client import remote_query
from rlmesh.telemetry.errors import ServiceUnavailableError, TelemetryError
from rlmesh.telemetry.schema import describe_column
from rlmesh.telemetry.store import execute_read_only, open_read_only, statements
from rlmesh.transport import Authenticator

RunSpec = str | os.PathLike[str]


def query(sql: str, run: RunSpec | Sequence[RunSpec] | None = None, timeout: float | None = None) -> pa.Table:
    """Run read-only SQL on a run's tables and return a pyarrow Table (``.to_pandas()`` for pandas).

    ``run``: ``None`` means this controller's current run, or in a worker its run, else
    ``"latest"``; or a run id, a run directory, or any DuckDB file path. A list of runs
    queries finished runs side by side: each is attached read-only under its run id (the
    first is the default), e.g. ``SELECT * FROM "<id1>".evals UNION ALL SELECT * FROM "<id2>".evals``.
    In the controller, this process's own buffered rows are flushed first, so a query sees
    its own writes; rows from worker procs arrive within about 0.2 s of being recorded.
    ``timeout``: the query's time limit in seconds (default ``RLMESH_QUERY_TIMEOUT_S``, 60 s); past it
    DuckDB stops the query and :class:`~rlmesh.telemetry.limits.QueryTimeoutError` says so.
    """
    statements(sql)  # a parse error or an empty query: the same message live or not
    limits.limit_for(timeout)  # a bad timeout: said here, live or not
    if run is not None and not isinstance(run, (str, os.PathLike)):
        return query_many([runs.resolve_db(r) for r in run], sql, timeout)
    svc = api.service()
    if svc is not None and (run is None or os.fspath(run) == svc.run_id):
        return _local(svc, sql, timeout)
    if run is None and settings.TELEMETRY_QUERY_ADDR.is_set() and settings.RUN_ID.is_set():
        return remote_query(settings.TELEMETRY_QUERY_ADDR.get(), api._auth(), sql, timeout)
    db = runs.resolve_db(run)
    if svc is not None and db == svc.store.path.resolve():
        return _local(svc, sql, timeout)
    return query_db(db, sql, timeout)


def _local(svc: object, sql: str, timeout: float | None = None) -> pa.Table:
    api.flush()
    return svc.query(sql, timeout)  # type: ignore[attr-defined]


def query_db(db: Path, sql: str, timeout: float | None = None) -> pa.Table:
    """One DuckDB file: its run's live service if the controller is still up, else the file read-only."""
    info = runs.live_service(db.parent) if db.name == runs.DB_NAME else None
    if info:
        try:
            auth = Authenticator(bytes.fromhex(info["secret"]))
            return remote_query(info["query_addr"], auth, sql, timeout)
        except ServiceUnavailableError:
            if runs.live_service(db.parent):
                raise
    return query_many([db], sql, timeout)


def query_run_dir(run_dir: Path, sql: str, timeout: float | None = None) -> pa.Table:
    """One run directory (the dashboard's and the exporter's unit): :func:`query_db` on its database."""
    return query_db(Path(run_dir) / runs.DB_NAME, sql, timeout)


def query_many(dbs: list[Path], sql: str, timeout: float | None = None) -> pa.Table:
    """Finished runs' files, attached read-only side by side (one file: the plain case).

    A file whose write-ahead log did not replay whole (its controller was killed, the log was torn)
    is read with the rows the log did hold, and one warning line says what was lost
    (:func:`rlmesh.telemetry.durability.check`)."""
    names = [runs.db_label(p) for p in dbs] if len(dbs) > 1 else [Path(dbs[0]).stem]
    if len(set(names)) != len(names):
        raise TelemetryError(f"two of the runs queried together have the same name: {names}")
    try:
        con = open_read_only(dict(zip(names, dbs)))
    except duckdb.Error as exc:  # a lock held by a live writer, not a DuckDB file, a damaged log, ...
        if not any(durability.repair(Path(db), exc) for db in dbs):
            raise TelemetryError(_open_error(dbs, exc)) from exc
        try:
            con = open_read_only(dict(zip(names, dbs)))
        except duckdb.Error as again:
            raise TelemetryError(_open_error(dbs, again)) from again
    try:
        for name, db in zip(names, dbs):
            durability.report(durability.check(Path(db), con, name))
        return execute_read_only(con, sql, catalog=names[0], timeout=timeout)
    finally:
        con.close()


def _open_error(dbs: list[Path], exc: Exception) -> str:
    msg = str(exc).splitlines()[0]
    where = ", ".join(map(str, dbs))
    if "lock" in msg.lower():  # only then can another process (a live run elsewhere) be the cause
        return (f"cannot open {where} read-only: another process holds it ({msg}). If its run is still going on "
                "another host, query it from the controller's host, where the service answers; a live run cannot "
                "be queried side by side with others.")
    return f"cannot read {where} as a DuckDB database: {msg}"


def tables(run: RunSpec | None = None) -> pa.Table:
    """Every table and column of a run with its type and documented meaning (what ``--schema`` prints)."""
    cols = query(
        "SELECT table_name AS \"table\", column_name AS \"column\", data_type AS \"type\" "
        "FROM information_schema.columns WHERE table_schema = 'main' AND table_catalog = current_database() "
        "ORDER BY table_name, ordinal_position",
        run,
    )
    docs = [describe_column(t, c) for t, c in zip(cols.column("table").to_pylist(), cols.column("column").to_pylist())]
    return cols.append_column("description", pa.array(docs, type=pa.string()))
