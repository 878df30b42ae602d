"""Messages between procs and the telemetry service: Arrow IPC frames behind the transport layer's MAC.

A batch message is ``[mac, header, ipc_1, ..., ipc_n]``: the header is a small
pickle (``("batches", origin, [table_1, ..., table_n], (sender id, batch seq))``) and
each ``ipc_i`` is one table's rows as an Arrow IPC stream, read back without copying.
The ``(sender id, batch seq)`` pair makes ingest idempotent: the service stores a
batch only if its seq is above the sender's last one, whatever the transport let through. Query request:
``[mac, header]`` with ``("query", sql)``; reply ``[mac, header, ipc]`` with
``("ok", None)`` or ``[mac, header]`` with ``("error", (exc_type, message))``.
The MAC and the message's freshness (:mod:`rlmesh.transport.channel`) are checked
before anything is unpickled or parsed.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rlmesh.transport import Inbound, Outbound, dumps, loads


def to_ipc(tbl: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tbl.schema) as w:
        w.write_table(tbl)
    return sink.getvalue()


def from_ipc(buf: Any) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(buf)).read_all()


def encode_batches(out: Outbound, origin: str, batches: list[tuple[str, pa.Table]],
                   key: tuple[str, int] = ("", 0)) -> list[Any]:
    header = dumps(("batches", origin, [t for t, _ in batches], key))[0]
    return out.sign([header, *(to_ipc(tbl) for _, tbl in batches)])


def encode(out: Outbound, kind: str, payload: Any, tables: list[pa.Table] = ()) -> list[Any]:  # type: ignore[assignment]
    header = dumps((kind, payload))[0]
    return out.sign([header, *(to_ipc(t) for t in tables)])


def decode_session(inbound: Inbound, frames: list[Any]) -> tuple[bytes, tuple[Any, ...], list[pa.Table]]:
    """Verify then decode: ``(session id, header_tuple, [tables])``; raises AuthError before decoding bad input."""
    sid, body = inbound.verify(frames)
    header = loads([body[0]])
    return sid, header, [from_ipc(getattr(f, "buffer", f)) for f in body[1:]]


def decode(inbound: Inbound, frames: list[Any]) -> tuple[tuple[Any, ...], list[pa.Table]]:
    _, header, tables = decode_session(inbound, frames)
    return header, tables
