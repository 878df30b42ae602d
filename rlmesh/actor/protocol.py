"""Wire formats of the control plane (controller <-> worker) and the data plane (caller -> actor).

Every message is ``[mac | session | counter | len(meta) | meta | payload head, *payload buffers]``
(signed by a :class:`~rlmesh.transport.channel.Outbound`, checked, freshness
included, by the receiving :class:`~rlmesh.transport.channel.Inbound`):
``meta`` is a small pickled tuple of plain values, the payload an optional
``transport.dumps`` frame list whose pickle head shares the first zmq frame (one
frame per message unless large buffers travel out of band). Keeping the meta
apart from the payload lets a worker answer "cannot unpickle your arguments" for
a call id it could still read.
"""

from __future__ import annotations

import pickle
from typing import Any

from rlmesh.transport.channel import Inbound, Outbound
from rlmesh.transport.serialization import dumps, loads

# data plane kinds
CALL = "c"  # expects a reply
CAST = "b"  # broadcast: fire and forget
CALLS = "cs"  # several calls and casts in one message: meta (CALLS, 0, "", "", caller, inbox), payload pack_calls
# reply statuses
OK = "ok"
ERR = "err"
BATCH = "batch"  # several replies in one message: meta (0, BATCH), payload [(call_id, status, payload head), ...]

# control plane kinds (worker -> controller)
HELLO = "hello"
HEARTBEAT = "hb"
SPAWNED = "spawned"
KV_REQ = "kv"
BYE = "bye"
# (controller -> worker)
SPAWN = "spawn"
PROC_UP = "up"
DIRECTORY = "dir"  # several procs up at once: up=[(proc_id, addr, incarnation), ...]
PROC_DOWN = "down"  # down=[(proc_id, incarnation, exit_code, signal, reason), ...]: the deaths of one supervisor turn
KV_REP = "kvrep"
HB_ACK = "hback"  # hb_s=: the heartbeat interval to use from now on
STOP = "stop"
HANG = "hang"  # fault injection: stop heartbeating and stall the loop, as a hung proc would
FENCED = "fenced"  # incarnation=: the proc was replaced by this incarnation; the stale one exits at once


PLAIN_KINDS = frozenset({HEARTBEAT, BYE, PROC_UP, PROC_DOWN, DIRECTORY, HB_ACK, STOP, HANG, FENCED})
"""Control kinds whose fields are always plain values (str, numbers, tuples): :func:`control` puts them in the meta."""


Packed = tuple[bytes, list[Any]]
"""A message before signing: ``(len(meta) | meta | payload head, payload buffers)``. Signing is per
recipient (each has its own key and session counter); packing is not, so a message sent to many
(a death told to every proc) is pickled once."""


def pack(meta: tuple, payload: list[Any] | None = None) -> Packed:
    m = pickle.dumps(meta, protocol=5)
    head = bytes(payload[0]) if payload else b""
    return len(m).to_bytes(4, "little") + m + head, list(payload[1:]) if payload else []


def encode(out: Outbound, meta: tuple, payload: list[Any] | None = None) -> list[Any]:
    if payload is None or len(payload) == 1:  # most calls and replies: one frame, packed and signed in one go
        m = pickle.dumps(meta, protocol=5)
        return [out.sign_one(b"".join((len(m).to_bytes(4, "little"), m, payload[0] if payload else b"")))]
    return out.sign_packed(*pack(meta, payload))


def decode_session(inbound: Inbound, frames: list[Any]) -> tuple[bytes, tuple, list[Any]]:
    """Verify MAC and freshness (raises ``AuthError``); return ``(session id, meta, payload_frames)``."""
    if len(frames) == 1:  # most messages: Inbound.open_one checks it in one Python frame
        sid, body = inbound.open_one(frames[0])
        n = int.from_bytes(body[:4], "little")
        head = body[4 + n:]
        return sid, pickle.loads(body[4:4 + n]), ([head] if head.nbytes else [])
    sid, body, extra = inbound.verify_packed(frames)
    n = int.from_bytes(body[:4], "little")
    meta = pickle.loads(body[4:4 + n])
    head = body[4 + n:]
    return sid, meta, ([head, *extra] if head.nbytes or extra else [])


def decode_meta(inbound: Inbound, frames: list[Any]) -> tuple[tuple, list[Any]]:
    """Verify MAC and freshness (raises ``AuthError``) and return ``(meta, payload_frames)``."""
    _, meta, payload = decode_session(inbound, frames)
    return meta, payload


def control(out: Outbound, kind: str, **fields: Any) -> list[Any]:
    """A control-plane message: meta ``(kind,)`` and the fields as one pickled payload, or, for the
    kinds in :data:`PLAIN_KINDS` (heartbeats, directory updates), meta ``(kind, fields)`` and no payload:
    a third of the cost (no out-of-band pickler), which counts at thousands of beats a second."""
    return out.sign_packed(*pack_control(kind, **fields))


def pack_control(kind: str, **fields: Any) -> Packed:
    """:func:`control` without the signature: pack once, then ``out.sign_packed(*packed)`` per recipient."""
    if kind in PLAIN_KINDS:
        return pack((kind, fields))
    return pack((kind,), dumps(fields))


def read_control(inbound: Inbound, frames: list[Any]) -> tuple[str, dict]:
    kind, msg, _ = read_control_session(inbound, frames)
    return kind, msg


def read_control_session(inbound: Inbound, frames: list[Any]) -> tuple[str, dict, bytes]:
    """Like :func:`read_control`, plus the sender's session id (to answer on :meth:`Inbound.reply_outbound`)."""
    sid, meta, payload = decode_session(inbound, frames)
    if len(meta) > 1:  # a PLAIN_KINDS message: the fields are in the meta
        return meta[0], meta[1], sid
    return meta[0], (loads(payload) if payload else {}), sid


def pack_replies(replies: list[tuple[int, str, bytes]]) -> list[Any]:
    """The payload of a :data:`BATCH` reply: one-frame replies ``(call_id, status, payload head)``, in
    the order they were made (issue 40: one message, MAC and wake-up for a burst of replies)."""
    return [pickle.dumps(replies, protocol=5)]


def unpack_replies(payload: list[Any]) -> list[tuple[int, str, bytes]]:
    """Inverse of :func:`pack_replies` (after the message's MAC and freshness were checked)."""
    head = payload[0]
    replies = pickle.loads(getattr(head, "buffer", head))
    if type(replies) is not list:
        raise ValueError(f"a batch of replies is a list, not {type(replies).__name__}")
    return replies


def pack_calls(calls: list[tuple[str, int, str, str, bytes]]) -> list[Any]:
    """The payload of a :data:`CALLS` message: one-frame calls ``(kind, call_id, actor_id, endpoint,
    args head)`` of one caller thread to one proc, in the order they were made (issue 40: one message,
    MAC and send for the calls of one turn of the caller's event loop)."""
    return [pickle.dumps(calls, protocol=5)]


def unpack_calls(payload: list[Any]) -> list[tuple[str, int, str, str, bytes]]:
    """Inverse of :func:`pack_calls` (after the message's MAC and freshness were checked)."""
    head = payload[0]
    calls = pickle.loads(getattr(head, "buffer", head))
    if type(calls) is not list:
        raise ValueError(f"a batch of calls is a list, not {type(calls).__name__}")
    return calls
