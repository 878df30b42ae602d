"""Telemetry: ``record()`` anywhere, SQL over every rollout, call, restart and GPU reading.

    import rlmesh as rm
    rm.telemetry.record("rollouts", reward=0.5, length=17, policy_version=3)
    rm.telemetry.query("SELECT policy_version, avg(reward) FROM rollouts GROUP BY 1")

Rows are buffered in each process and shipped in Arrow batches to the run's
telemetry service, which appends them to ``runs/<run_id>/telemetry.duckdb``. See
``docs/telemetry.md`` for every built-in table and column.

Importing this package is cheap: pyarrow, zmq and DuckDB load on first use.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlmesh.telemetry import errors
from rlmesh.telemetry.limits import QueryCancelledError, QueryTimeoutError
from rlmesh.telemetry.schema import SchemaError

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = [
    "SchemaError", "ReadOnlyQueryError", "RunNotFoundError", "TelemetryError", "QueryTimeoutError",
    "QueryCancelledError",
    "current_run", "end_run", "flush", "query", "record", "record_batch", "set_config",
    "start_run", "tables",
]

_rec: Any = None  # this process's recorder, cached for record(); reset at fork and at end_run()


def _forget_after_fork() -> None:
    global _rec
    _rec = None  # a forked child re-decides (its parent's threads did not survive the fork)


os.register_at_fork(after_in_child=_forget_after_fork)


def record(table: str, /, **row: Any) -> None:
    """Append one row to ``table`` (created on first use); returns at once, without I/O.

    Values: int, float, str, bool, bytes, datetime, list, dict, or None. Automatic
    columns (``run_id``, ``ts``, ``mesh``, ``rank``, ``proc``, ``host``) are added. Types are
    checked on the flush thread: a row whose value does not fit its column is kept in
    ``_rejected`` instead, and the :class:`SchemaError` naming table, column, both types and who
    recorded it is raised by the next ``record()`` into that table (or by :func:`flush`).
    """
    global _rec
    rec = _rec
    if rec is None:
        from rlmesh.telemetry import api  # deferred: api loads pyarrow and zmq; importing rlmesh.telemetry stays cheap

        rec = _rec = api.recorder()
    rec.record(table, row)


def record_batch(table: str, data: Any) -> None:
    """Append many rows at once: a ``pyarrow.Table`` or a dict of column -> list/numpy array.

    The fast path for producers that already hold columns (a rollout batch, a
    tensor of per-token rewards): no per-row Python work at all.
    """
    from rlmesh.telemetry import api  # deferred: api loads pyarrow and zmq; importing rlmesh.telemetry stays cheap

    api.recorder().record_batch(table, data)


def query(sql: str, run: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
          timeout: float | None = None) -> "pa.Table":
    """Read-only SQL over a run (default: this controller's run, else ``latest``) -> pyarrow Table.

    The one read path of telemetry (see :func:`rlmesh.telemetry.reader.query`); a list of
    finished runs is attached read-only side by side, each under its run id. ``timeout``: the
    query's time limit in seconds (default ``RLMESH_QUERY_TIMEOUT_S``, 60); past it DuckDB stops
    the query and :class:`QueryTimeoutError` says so."""
    from rlmesh.telemetry.reader import query as _query  # deferred: the reader loads pyarrow and DuckDB; importing rlmesh.telemetry stays cheap

    return _query(sql, run, timeout)


def tables(run: str | os.PathLike[str] | None = None) -> "pa.Table":
    """Tables and columns of a run with types and documented meanings."""
    from rlmesh.telemetry.reader import tables as _tables  # deferred: the reader loads pyarrow and DuckDB; importing rlmesh.telemetry stays cheap

    return _tables(run)


def flush(timeout: float = 10.0) -> None:
    """Ship buffered rows now (in the controller: and wait until they are in the file); raises the
    :class:`SchemaError` of a refused row that no ``record()`` has raised yet."""
    from rlmesh.telemetry import api  # deferred: api loads pyarrow and zmq; importing rlmesh.telemetry stays cheap

    api.flush(timeout)


def current_run() -> str | None:
    """Id of the run this process records into, or ``None`` before the first record/spawn."""
    from rlmesh.telemetry import api  # deferred: api loads pyarrow and zmq; importing rlmesh.telemetry stays cheap

    return api.current_run()


def start_run(config: Any = None, *, run_id: str | None = None, runs_dir: str | None = None,
              resume: bool = False) -> str | None:
    """Start the run explicitly (normally implicit), e.g. to store its config; returns the run id
    (``None`` when telemetry is off). ``resume=True`` continues run ``run_id`` (its controller
    died): the same id and database, appended to."""
    from rlmesh.telemetry import api  # deferred: api loads pyarrow and zmq; importing rlmesh.telemetry stays cheap

    return api.start_run(_jsonable(config), run_id=run_id, runs_dir=runs_dir, resume=resume)


def set_config(config: Any) -> None:
    """Store the run's config (a dict, dataclass or anything JSON-able) in ``runs.config``."""
    from rlmesh.telemetry import api  # deferred: api loads pyarrow and zmq; importing rlmesh.telemetry stays cheap

    api.start_run(_jsonable(config))  # a no-op when telemetry is off


def end_run(status: str | None = None, error: str | None = None) -> None:
    """Finish the run now (``ok``, or ``failed`` after an uncaught exception; ``error``, why, goes to
    ``runs.error``); normally done at exit."""
    from rlmesh.telemetry import api  # deferred: api loads pyarrow and zmq; importing rlmesh.telemetry stays cheap

    api.end_run(status, error)


def _jsonable(config: Any) -> Any:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return config


def __getattr__(name: str) -> Any:
    if name in ("ReadOnlyQueryError", "RunNotFoundError", "TelemetryError", "ServiceUnavailableError"):
        return getattr(errors, name)
    raise AttributeError(f"module 'rlmesh.telemetry' has no attribute {name!r}")
