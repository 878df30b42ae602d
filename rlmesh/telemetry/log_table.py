"""The ``logs`` table's rows as Arrow columns: every line a proc printed in one flush tick, one batch.

Apart from :mod:`rlmesh.telemetry.logs` (the sinks, on the launcher's reader thread) because
this half needs numpy and pyarrow, which only the flush thread should load: the controller
reaches its first call without them (issue 16).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rlmesh.launch.output import ProcLine, OutputStream
from rlmesh.telemetry import arrays
from rlmesh.telemetry.columnar import const

# logs column <- ProcMeta attribute, Arrow type (as the catalog declares them)
_PROC_COLUMNS = (("mesh", "proc_mesh", pa.string()), ("rank", "rank", pa.int64()), ("proc", "proc_id", pa.string()),
                 ("host", "host", pa.string()), ("incarnation", "incarnation", pa.int64()),
                 ("pid", "pid", pa.int64()))

RECORD_COLUMNS = ("level", "logger", "exception", "actor")  # set for logging records only


def lines_table(lines: list[ProcLine]) -> pa.Table:
    """The ``logs`` rows of one read, built column by column (one read is usually one proc's stdout)."""
    n = len(lines)
    procs = [ln.proc for ln in lines]
    p0 = procs[0]
    one = all(p is p0 for p in procs)
    stamps = np.fromiter((ln.ts for ln in lines), np.float64, n)
    cols: dict[str, pa.Array] = {"ts": arrays.timestamps((stamps * 1e6).astype(np.int64))}
    for name, attr, typ in _PROC_COLUMNS:
        cols[name] = (const(getattr(p0, attr), n, typ) if one
                      else arrays.array([getattr(p, attr) for p in procs], typ))
    streams = [ln.stream for ln in lines]
    s0 = streams[0]
    cols["stream"] = const(s0.value, n, pa.string()) if streams.count(s0) == n else arrays.array([s.value for s in streams], pa.string())
    cols["message"] = arrays.array([ln.message for ln in lines], pa.string())
    if all(ln.stream is not OutputStream.LOG for ln in lines):  # stdout/stderr lines: no record fields
        for name in RECORD_COLUMNS:
            cols[name] = pa.nulls(n, pa.string())
    else:
        for name in RECORD_COLUMNS:
            cols[name] = arrays.array([getattr(ln, name) for ln in lines], pa.string())
    return pa.table(cols)
