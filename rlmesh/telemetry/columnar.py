"""Rows -> Arrow: one typed array per column, built on the flush thread, never in the caller.

Rows that cannot be converted (a value pyarrow refuses for the column's type) are not
dropped: they become rows of the ``_rejected`` table, with the reason and the row as
JSON, and the error is logged naming table and column.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

logger = logging.getLogger(__name__)

TS_TYPE = pa.timestamp("us", tz="UTC")
REJECTED = "_rejected"

_ARROW: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMPTZ": TS_TYPE,
    "BLOB": pa.binary(),
}
_META = ("mesh", "rank", "proc", "host")


def arrow_type(sql_type: str | None) -> pa.DataType | None:
    """The Arrow type for a declared column, or ``None`` to let pyarrow infer (nested user types)."""
    return _ARROW.get(sql_type.upper()) if sql_type else None


def ts_array(values: Sequence[Any]) -> pa.Array:
    """Epoch seconds (float/int), datetimes or None -> ``timestamp[us, UTC]``."""
    if all(type(v) is float or type(v) is int for v in values):
        return pa.array((np.asarray(values, dtype=np.float64) * 1e6).astype(np.int64), type=TS_TYPE)
    out = []
    for v in values:
        if v is None or isinstance(v, (int, float)):
            out.append(None if v is None else int(v * 1e6))
        else:  # datetime: let pyarrow handle naive/aware
            out.append(pa.scalar(v, type=TS_TYPE).value)
    return pa.array(out, type=TS_TYPE)


def _jsonish(v: Any) -> Any:
    return v if v is None or isinstance(v, str) else json.dumps(v, default=repr)


def column_array(values: list[Any], sql_type: str | None) -> pa.Array:
    t = arrow_type(sql_type)
    if t is None:
        return pa.array(values)
    if t is TS_TYPE:
        return ts_array(values)
    if sql_type and sql_type.upper() == "JSON":
        values = [_jsonish(v) for v in values]
    return pa.array(values, type=t)


def rows_to_arrow(
    table: str,
    rows: list[tuple[float, tuple[str, int, str, str], dict[str, Any]]],
    run_id: str,
    sql_types: dict[str, str],
) -> tuple[str, pa.Table]:
    """``[(ts, (mesh, rank, proc, host), row), ...]`` -> ``(table, Arrow table)``, automatic columns first.

    A row may set ``ts``/``mesh``/``rank``/``proc``/``host`` itself; ``run_id`` is always the run's.
    """
    first = list(rows[0][2])
    seen = set(first)
    extra = set().union(*(r for _, _, r in rows)) - seen
    user = [k for k in first if k != "run_id"] + sorted(k for k in extra if k != "run_id")
    n = len(rows)
    arrays: dict[str, pa.Array] = {"run_id": pa.array([run_id] * n, type=pa.string())}
    try:
        if "ts" in seen or "ts" in extra:
            arrays["ts"] = ts_array([r.get("ts", ts) for ts, _, r in rows])
        else:
            arrays["ts"] = ts_array([ts for ts, _, _ in rows])
        for i, name in enumerate(_META):
            if name in seen or name in extra:
                vals = [r.get(name, m[i]) for _, m, r in rows]
            else:
                vals = [m[i] for _, m, _ in rows]
            arrays[name] = pa.array(vals, type=pa.int64() if name == "rank" else pa.string())
        for k in user:
            if k in arrays:
                continue
            arrays[k] = column_array([r.get(k) for _, _, r in rows], sql_types.get(k))
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        col = locals().get("k", "?")
        logger.error("telemetry table %r column %r: rows do not convert (%s); kept in %s",
                     table, col, exc, REJECTED)
        return REJECTED, rejected_batch(table, f"column {col!r}: {exc}", [r for _, _, r in rows], run_id)
    return table, pa.table(arrays)


def with_auto_columns(tbl: pa.Table, run_id: str, ts: float, meta: tuple[str, int, str, str]) -> pa.Table:
    """Add the automatic columns a ``record_batch`` table lacks (same ts and origin for every row)."""
    n = tbl.num_rows
    auto: dict[str, pa.Array] = {"run_id": pa.array([run_id] * n, type=pa.string())}
    if "ts" not in tbl.column_names:
        auto["ts"] = pa.array(np.full(n, int(ts * 1e6), dtype=np.int64), type=TS_TYPE)
    for i, name in enumerate(_META):
        if name not in tbl.column_names:
            auto[name] = pa.array([meta[i]] * n, type=pa.int64() if name == "rank" else pa.string())
    cols = {**auto, **{c: tbl.column(c) for c in tbl.column_names if c != "run_id"}}
    return pa.table(cols)


def rejected_batch(table: str, reason: str, rows: list[dict[str, Any]], run_id: str) -> pa.Table:
    """Rows that did not fit ``table``, kept as JSON so nothing vanishes silently."""
    n = len(rows)
    return pa.table({
        "run_id": pa.array([run_id] * n, type=pa.string()),
        "table_name": pa.array([table] * n, type=pa.string()),
        "reason": pa.array([reason] * n, type=pa.string()),
        "row": pa.array([json.dumps(r, default=repr) for r in rows], type=pa.string()),
    })
