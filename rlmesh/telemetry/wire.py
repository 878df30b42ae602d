"""Messages between procs and the telemetry service: Arrow IPC frames behind the transport layer's MAC.

A batch message is ``[mac, header, ipc_1, ..., ipc_n]``: the header is a small
pickle (``("batches", origin, [table_1, ..., table_n])``) and each ``ipc_i`` is one
table's rows as an Arrow IPC stream, read back without copying. Query request:
``[mac, header]`` with ``("query", sql)``; reply ``[mac, header, ipc]`` with
``("ok", None)`` or ``[mac, header]`` with ``("error", (exc_type, message))``.
The MAC is checked before anything is unpickled or parsed.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rlmesh.transport import Authenticator, dumps, loads


def to_ipc(tbl: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tbl.schema) as w:
        w.write_table(tbl)
    return sink.getvalue()


def from_ipc(buf: Any) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(buf)).read_all()


def encode_batches(auth: Authenticator, origin: str, batches: list[tuple[str, pa.Table]]) -> list[Any]:
    header = dumps(("batches", origin, [t for t, _ in batches]))[0]
    return auth.sign([header, *(to_ipc(tbl) for _, tbl in batches)])


def encode(auth: Authenticator, kind: str, payload: Any, tables: list[pa.Table] = ()) -> list[Any]:  # type: ignore[assignment]
    header = dumps((kind, payload))[0]
    return auth.sign([header, *(to_ipc(t) for t in tables)])


def decode(auth: Authenticator, frames: list[Any]) -> tuple[tuple[Any, ...], list[pa.Table]]:
    """Verify then decode: returns ``(header_tuple, [tables])``; raises AuthError before decoding bad input."""
    body = auth.verify(frames)
    header = loads([body[0]])
    return header, [from_ipc(getattr(f, "buffer", f)) for f in body[1:]]
