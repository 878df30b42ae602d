"""``query(sql, run=...)``: the same SQL on a live run (through its service) and a finished one (the file).

Why through the service while live: DuckDB lets one process open a file read-write
and then nobody else may open it, not even read-only. The service already holds the
file, so it answers; after the run the file is opened ``read_only=True``. Either way
the SQL must be read-only (SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN).
"""

from __future__ import annotations

import os
from pathlib import Path
import pyarrow as pa

from rlmesh.telemetry import api
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.client import remote_query
from rlmesh.telemetry.errors import ServiceUnavailableError, TelemetryError
from rlmesh.telemetry.schema import describe_column
from rlmesh.transport import Authenticator


def query(sql: str, run: str | os.PathLike[str] | None = None, timeout: float = 60.0) -> pa.Table:
    """Run read-only SQL on a run's tables and return a pyarrow Table (``.to_pandas()`` for pandas).

    ``run``: ``None`` means this controller's current run, or in a worker its run, else
    ``"latest"``; or a run id, a run directory, or a ``.duckdb`` path. In the controller,
    this process's own buffered rows are flushed first, so a query sees its own writes;
    rows from worker procs arrive within about 0.2 s of being recorded.
    """
    svc = api.service()
    if svc is not None and (run is None or os.fspath(run) == svc.run_id):
        return _local(svc, sql)
    if run is None and os.environ.get(api.QUERY_ADDR_ENV) and os.environ.get(api.RUN_ID_ENV):
        from rlmesh.telemetry.store import check_read_only  # deferred: store loads DuckDB; a query a live service answers never needs it

        check_read_only(sql)
        return remote_query(os.environ[api.QUERY_ADDR_ENV], api._auth(), sql, timeout)
    run_dir = runs.resolve_run(run)
    if svc is not None and run_dir == svc.run_dir.resolve():
        return _local(svc, sql)
    return query_run_dir(run_dir, sql, timeout)


def _local(svc: object, sql: str) -> pa.Table:
    from rlmesh.telemetry.store import check_read_only  # deferred: store loads DuckDB; a query a live service answers never needs it

    check_read_only(sql)
    api.flush()
    return svc.query(sql)  # type: ignore[attr-defined]


def query_run_dir(run_dir: Path, sql: str, timeout: float = 60.0) -> pa.Table:
    """Query one run directory: its live service if the controller is still up, else the file read-only."""
    from rlmesh.telemetry.store import check_read_only  # deferred: store loads DuckDB; a query a live service answers never needs it

    check_read_only(sql)  # refuse early, with the same message live or not
    info = runs.live_service(run_dir)
    if info:
        try:
            auth = Authenticator(bytes.fromhex(info["secret"]))
            return remote_query(info["query_addr"], auth, sql, timeout)
        except ServiceUnavailableError:
            if runs.live_service(run_dir):
                raise
    return _query_file(run_dir / runs.DB_NAME, sql)


def _query_file(path: Path, sql: str) -> pa.Table:
    import duckdb  # deferred: DuckDB is heavy; only reading a finished run's file needs it

    from rlmesh.telemetry.store import execute_read_only  # deferred: store loads DuckDB; a query a live service answers never needs it

    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.IOException as exc:
        raise TelemetryError(
            f"cannot open {path} read-only ({exc}). If its run is still going on another host, "
            "query it from the controller's host, where the service answers."
        ) from exc
    try:
        return execute_read_only(con, sql)
    finally:
        con.close()


def tables(run: str | os.PathLike[str] | None = None) -> pa.Table:
    """Every table and column of a run with its type and documented meaning (what ``--schema`` prints)."""
    cols = query(
        "SELECT table_name AS \"table\", column_name AS \"column\", data_type AS \"type\" "
        "FROM information_schema.columns WHERE table_schema = 'main' "
        "ORDER BY table_name, ordinal_position",
        run,
    )
    docs = [describe_column(t, c) for t, c in zip(cols.column("table").to_pylist(), cols.column("column").to_pylist())]
    return cols.append_column("description", pa.array(docs, type=pa.string()))

