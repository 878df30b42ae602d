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

from rlmesh.telemetry import arrays
from rlmesh.telemetry.arrays import TS_TYPE
from rlmesh.telemetry.wire import columns_of

logger = logging.getLogger(__name__)

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


def const(value: Any, n: int, type_: pa.DataType) -> pa.Array:
    """``n`` copies of one value (from buffers: no pandas import, see :mod:`rlmesh.telemetry.arrays`)."""
    return arrays.repeat(value, n, type_)


def arrow_type(sql_type: str | None) -> pa.DataType | None:
    """The Arrow type for a declared column, or ``None`` to let pyarrow infer (nested user types)."""
    return _ARROW.get(sql_type.upper()) if sql_type else None


def ts_array(values: Sequence[Any]) -> pa.Array:
    """Epoch seconds (float/int), datetimes or None -> ``timestamp[us, UTC]``."""
    if all(type(v) is float or type(v) is int for v in values):
        return arrays.timestamps((np.asarray(values, dtype=np.float64) * 1e6).astype(np.int64))
    out = []
    for v in values:
        if v is None or isinstance(v, (int, float)):
            out.append(None if v is None else int(v * 1e6))
        else:  # datetime: let pyarrow handle naive/aware
            out.append(pa.scalar(v, type=TS_TYPE).value)
    return arrays.array(out, TS_TYPE)


def _jsonish(v: Any) -> Any:
    return v if v is None or isinstance(v, str) else json.dumps(v, default=repr)


def column_array(values: list[Any], sql_type: str | None) -> pa.Array:
    t = arrow_type(sql_type)
    if t is None:
        return arrays.inferred(values)
    if t is TS_TYPE:
        return ts_array(values)
    if sql_type and sql_type.upper() == "JSON":
        values = [_jsonish(v) for v in values]
    return arrays.array(values, t)


def rows_to_arrow(
    table: str,
    rows: list[tuple[float, tuple[str, int, str, str], dict[str, Any]]],
    run_id: str,
    sql_types: dict[str, str],
) -> tuple[str, pa.Table]:
    """``[(ts, (mesh, rank, proc, host), row), ...]`` -> ``(table, Arrow table)``, automatic columns first.

    A row may set ``ts``/``mesh``/``rank``/``proc``/``host`` itself; ``run_id`` is always the run's.
    """
    stamps, metas, dicts = (list(c) for c in zip(*rows))
    return columns_to_arrow(table, stamps, metas, dicts, columns_of(dicts), run_id, sql_types)


def columns_to_arrow(
    table: str,
    stamps: list[float],
    metas: list[tuple[str, int, str, str]],
    dicts: list[dict[str, Any]],
    columns: tuple[list[str], list[list[Any]]],
    run_id: str,
    sql_types: dict[str, str],
) -> tuple[str, pa.Table]:
    """:func:`rows_to_arrow` from the rows' parts, in parallel lists: their stamps, origins, the rows
    themselves (kept for ``_rejected``) and their ``columns`` (:func:`~rlmesh.telemetry.wire.columns_of`)."""
    n = len(dicts)
    keys, values = columns
    cols: dict[str, pa.Array] = {"run_id": const(run_id, n, pa.string())}
    col = "?"
    try:
        own = dict(zip(keys, values))
        if "ts" in own:
            stamps = [t if v is None else v for t, v in zip(stamps, own.pop("ts"))]
            cols["ts"] = ts_array(stamps)
        else:
            cols["ts"] = arrays.timestamps((np.array(stamps, dtype=np.float64) * 1e6).astype(np.int64))
        m0 = metas[0]
        same = metas.count(m0) == n  # identical (or equal) origins: the common case, one actor
        for i, name in enumerate(_META):
            col = name
            t = pa.int64() if name == "rank" else pa.string()
            if name not in own and same:
                cols[name] = const(m0[i], n, t)
                continue
            vals = [m0[i]] * n if same else [m[i] for m in metas]
            if name in own:
                vals = [d if v is None else v for d, v in zip(vals, own.pop(name))]
            cols[name] = arrays.array(vals, t)
        for col, vals in own.items():
            cols[col] = column_array(vals, sql_types.get(col))
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        logger.error("telemetry table %r column %r: rows do not convert (%s); kept in %s",
                     table, col, exc, REJECTED)
        return REJECTED, rejected_batch(table, f"column {col!r}: {exc}", dicts, run_id)
    return table, pa.table(cols)


def with_auto_columns(tbl: pa.Table, run_id: str, ts: float, meta: tuple[str, int, str, str]) -> pa.Table:
    """Add the automatic columns a ``record_batch`` table lacks (same ts and origin for every row)."""
    n = tbl.num_rows
    auto: dict[str, pa.Array] = {"run_id": const(run_id, n, pa.string())}
    if "ts" not in tbl.column_names:
        auto["ts"] = const(int(ts * 1e6), n, TS_TYPE)
    for i, name in enumerate(_META):
        if name not in tbl.column_names:
            auto[name] = const(meta[i], n, pa.int64() if name == "rank" else pa.string())
    cols = {**auto, **{c: tbl.column(c) for c in tbl.column_names if c != "run_id"}}
    return pa.table(cols)


def rejected_batch(table: str, reason: str, rows: list[dict[str, Any]], run_id: str) -> pa.Table:
    """Rows that did not fit ``table``, kept as JSON so nothing vanishes silently."""
    n = len(rows)
    return pa.table({
        "run_id": const(run_id, n, pa.string()),
        "table_name": const(table, n, pa.string()),
        "reason": const(reason, n, pa.string()),
        "row": arrays.array([json.dumps(r, default=repr) for r in rows], pa.string()),
    })
