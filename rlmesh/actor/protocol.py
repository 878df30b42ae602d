"""Wire formats of the control plane (controller <-> worker) and the data plane (caller -> actor).

Every message is ``[mac, meta, *payload]``: ``meta`` is a small pickled tuple of
plain values, ``payload`` an optional ``transport.dumps`` frame list. Keeping the
meta separate lets a worker answer "cannot unpickle your arguments" for a call id
it could still read.
"""

from __future__ import annotations

import pickle
from typing import Any

from rlmesh.transport.auth import Authenticator
from rlmesh.transport.serialization import dumps, loads

# data plane kinds
CALL = "c"  # expects a reply
CAST = "b"  # broadcast: fire and forget
# reply statuses
OK = "ok"
ERR = "err"

# control plane kinds (worker -> controller)
HELLO = "hello"
HEARTBEAT = "hb"
SPAWNED = "spawned"
KV_REQ = "kv"
BYE = "bye"
# (controller -> worker)
SPAWN = "spawn"
PROC_UP = "up"
PROC_DOWN = "down"
KV_REP = "kvrep"
HB_ACK = "hback"
STOP = "stop"
HANG = "hang"  # fault injection: stop heartbeating and stall the loop, as a hung proc would


def encode(auth: Authenticator, meta: tuple, payload: list[Any] | None = None) -> list[Any]:
    frames = [pickle.dumps(meta, protocol=5)]
    if payload:
        frames.extend(payload)
    return auth.sign(frames)


def decode_meta(auth: Authenticator, frames: list[Any]) -> tuple[tuple, list[Any]]:
    """Verify the MAC (raises ``AuthError``) and return ``(meta, payload_frames)``."""
    body = auth.verify(frames)
    meta = pickle.loads(getattr(body[0], "buffer", body[0]))
    return meta, body[1:]


def control(auth: Authenticator, kind: str, **fields: Any) -> list[Any]:
    """A control-plane message: meta ``(kind,)`` and the fields as one pickled payload."""
    return encode(auth, (kind,), dumps(fields))


def read_control(auth: Authenticator, frames: list[Any]) -> tuple[str, dict]:
    meta, payload = decode_meta(auth, frames)
    return meta[0], (loads(payload) if payload else {})
