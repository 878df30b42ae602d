"""Messages between procs and the telemetry service: Arrow IPC frames behind the transport layer's MAC.

A batch message is ``[mac, header, ipc_1, ..., ipc_n]``: the header is a small
pickle (``("batches", origin, [table_1, ..., table_n], (sender id, batch seq), raw)``) and
each ``ipc_i`` is one table's rows as an Arrow IPC stream, read back without copying.
``raw`` is ``[(table, rows, sql_types), ...]``: a small flush's rows as they were recorded
(:class:`RawRows`), which the service turns into Arrow itself.
The ``(sender id, batch seq)`` pair makes ingest idempotent: the service stores a
batch only if its seq is above the sender's last one, whatever the transport let through. Query request:
``[mac, header]`` with ``("query", sql)``; reply ``[mac, header, ipc]`` with
``("ok", None)`` or ``[mac, header]`` with ``("error", (exc_type, message))``.
The MAC and the message's freshness (:mod:`rlmesh.transport.channel`) are checked
before anything is unpickled or parsed.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from rlmesh.transport import Inbound, Outbound, dumps, loads

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa


@dataclass
class RawRows:
    """One table's rows of a small flush, handed to the sink as they were recorded, not as Arrow.

    Why: a proc that records little (spans of a few calls, a health sample, its lifecycle) would
    load pyarrow and numpy (~0.1 s of CPU, ~50 MB) only to turn a handful of rows into Arrow.
    Up to ``Recorder.raw_max_rows`` rows a flush, the remote sink ships them as they are (in the
    message's header) and the service converts them with the same function
    (:func:`rlmesh.telemetry.columnar.rows_to_arrow`) and the column types this proc knows, so a
    table looks the same either way.
    """

    rows: list[tuple[float, tuple[str, int, str, str], dict[str, Any]]]
    sql_types: dict[str, str]

    @property
    def num_rows(self) -> int:
        return len(self.rows)


def columns_of(dicts: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Rows as recorded -> ``(keys, one list of values per key)``: the first row's keys in its order,
    then any other row's, sorted; a key a row lacks reads None. ``run_id`` is never a row's own.

    Plain Python (a small flush converts without pyarrow). When every row has the same keys, as
    rows from one call site do, a column is ``map(itemgetter)`` at C speed, and no new object per
    row is made (a tuple per row would wake the garbage collector over every queued row)."""
    keys = [k for k in dicts[0] if k != "run_id"]
    if len(set(map(len, dicts))) == 1:  # as many keys in every row: the same keys unless one is missing
        try:
            return keys, [list(map(itemgetter(k), dicts)) for k in keys]
        except KeyError:
            pass
    keys += sorted(set().union(*dicts).difference(keys, ("run_id",)))
    return keys, [[d.get(k) for d in dicts] for k in keys]


def to_ipc(tbl: pa.Table) -> pa.Buffer:
    import pyarrow as pa  # deferred: ~0.1 s of CPU with numpy; a proc loads it at its first flush, not its start

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tbl.schema) as w:
        w.write_table(tbl)
    return sink.getvalue()


def from_ipc(buf: Any) -> pa.Table:
    import pyarrow as pa  # deferred: as in to_ipc

    return pa.ipc.open_stream(pa.py_buffer(buf)).read_all()


def encode_batches(out: Outbound, origin: str, batches: list[tuple[str, Any]],
                   key: tuple[str, int] = ("", 0)) -> list[Any]:
    """``batches``: ``(table, pyarrow.Table)`` pairs, and ``(table, RawRows)`` pairs that go in the header."""
    tables = [(name, b) for name, b in batches if not isinstance(b, RawRows)]
    raw = [(name, b.rows, b.sql_types) for name, b in batches if isinstance(b, RawRows)]
    header = dumps(("batches", origin, [t for t, _ in tables], key, raw))[0]
    return out.sign([header, *(to_ipc(tbl) for _, tbl in tables)])


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
