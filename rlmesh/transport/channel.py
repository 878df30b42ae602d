"""Replay-proof message authentication: per-channel keys, per-session strictly increasing counters.

Why: a MAC keyed by the job secret alone proves who wrote a message, not that it
is fresh; a captured ``train`` call re-sent from a new socket would verify and run
again. So every listening socket (a *channel*) draws a random nonce when it binds
and advertises it in its address (``tcp://host:port#m<nonce>``); senders MAC with
``key = BLAKE2b(secret, nonce)``, so a message is valid for that one socket
incarnation only (a restarted proc, or another socket of the run, has another
key). Each sending socket is a *session*: a random 8-byte id plus a counter that
goes up by one per message. The receiver keeps the highest counter seen per
session and drops (and counts) anything not strictly above it: a replayed or
reordered message is never decoded. Truncation fails the MAC, which binds the
frame count and every frame's size.

Replies on the same connection (ROUTER -> DEALER) use a key derived from the
channel key and the requester's session id, so a reply is valid for that one
requester's session and no other socket.

Cost on the hot path: one BLAKE2b over the small frames (as before), 16 more
bytes, one dict lookup and one integer compare per message; no syscall.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from rlmesh.transport.refusals import RefusalLog

MAC_LEN = 32
SID_LEN = 8
HDR_LEN = SID_LEN + 8  # session id + counter
PREFIX_LEN = MAC_LEN + HDR_LEN
NONCE_LEN = 16
_FULL_UNDER = 64 * 1024  # frames at least this large are bound by size (raw array bytes, never unpickled)


class AuthError(PermissionError):
    """A message failed authentication or freshness, or a connection would leave loopback unprotected."""


def derive(key: bytes, label: bytes, data: bytes = b"") -> bytes:
    """A 32-byte subkey of ``key`` for ``label`` and ``data`` (BLAKE2b in keyed mode, a standard KDF use)."""
    return hashlib.blake2b(label + b"\0" + data, key=key[:64], digest_size=32).digest()


_ONE_FRAME = (1).to_bytes(4, "little")
_BAD_MAC = "bad MAC: the peer does not hold this job's secret, or the message was cut"


def _keyed(key: bytes) -> Any:
    """The keyed BLAKE2b state every MAC of a channel starts from: a ``copy()`` of it costs a third of
    keying a new one (which hashes a whole key block), and there are four MACs per round trip."""
    return hashlib.blake2b(key=key, digest_size=MAC_LEN)


def _mac(keyed: Any, hdr: bytes | memoryview, frames: list[Any]) -> bytes:
    """BLAKE2b over the header, the frame count, each frame's size, and the frames' bytes (frames of
    ``_FULL_UNDER`` bytes or more, after the first, by size only)."""
    h = keyed.copy()
    if len(frames) == 1:  # the usual message: the same bytes hashed in two updates rather than four
        mv = memoryview(getattr(frames[0], "buffer", frames[0]))
        h.update(b"".join((hdr, _ONE_FRAME, mv.nbytes.to_bytes(8, "little"))))
        h.update(mv)
        return h.digest()
    h.update(hdr)
    h.update(len(frames).to_bytes(4, "little"))
    for i, fr in enumerate(frames):
        mv = memoryview(getattr(fr, "buffer", fr))
        n = mv.nbytes
        h.update(n.to_bytes(8, "little"))
        if i == 0 or n < _FULL_UNDER:
            h.update(mv)
    return h.digest()


class Outbound:
    """The sending end of one session on one channel. Use from one thread, and send in signing order."""

    __slots__ = ("_key", "_keyed", "sid", "_n")

    def __init__(self, key: bytes, sid: bytes | None = None):
        self._key = key
        self._keyed = _keyed(key)
        self.sid = sid or secrets.token_bytes(SID_LEN)
        self._n = 0

    def _hdr(self) -> bytes:
        self._n += 1
        return self.sid + self._n.to_bytes(8, "little")

    def sign_packed(self, body: bytes, extra: list[Any]) -> list[Any]:
        """``[mac + sid + n + body, *extra]``: the MAC shares the first frame (one zmq frame fewer)."""
        hdr = self._hdr()
        return [_mac(self._keyed, hdr, [body, *extra]) + hdr + body, *extra]

    def sign_one(self, body: bytes) -> bytes:
        """:meth:`sign_packed` of a one-frame message (most calls and replies), in one Python frame
        instead of four: the same bytes and the same MAC (``_mac``'s two updates as one)."""
        self._n = n = self._n + 1
        hdr = self.sid + n.to_bytes(8, "little")
        h = self._keyed.copy()
        h.update(b"".join((hdr, _ONE_FRAME, len(body).to_bytes(8, "little"), body)))
        return h.digest() + hdr + body

    def sign(self, frames: list[Any]) -> list[Any]:
        """``[mac + sid + n, *frames]`` for senders whose first frame must stay apart (JSON, Arrow)."""
        hdr = self._hdr()
        return [_mac(self._keyed, hdr, frames) + hdr, *frames]

    def reply_inbound(self, name: str) -> "Inbound":
        """Where replies to this session are checked (a DEALER's receiving side)."""
        return Inbound(derive(self._key, b"reply", self.sid), name)


class Inbound:
    """The receiving end of a channel: verifies MAC and freshness before anything is decoded.

    Use from one thread at a time (each rlmesh socket has one reading thread).
    """

    def __init__(self, key: bytes, name: str, nonce: bytes = b""):
        self._key = key
        self._keyed = _keyed(key)
        self.name = name
        self.nonce = nonce
        self._last: dict[bytes, int] = {}
        self._replies: dict[bytes, Outbound] = {}
        self.log = RefusalLog(name)

    @property
    def rejected(self) -> int:
        return self.log.counts.rejected

    @property
    def replayed(self) -> int:
        return self.log.counts.replayed

    def _check(self, mac: Any, hdr: memoryview, frames: list[Any], raw: list[Any]) -> bytes:
        if not hmac.compare_digest(mac, _mac(self._keyed, hdr, frames)):
            self.log.refused(_peer(raw), _BAD_MAC)
            raise AuthError(_BAD_MAC)
        sid = bytes(hdr[:SID_LEN])
        n = int.from_bytes(hdr[SID_LEN:], "little")
        if n <= self._last.get(sid, 0):
            self.log.replayed(_peer(raw))
            raise AuthError(f"stale counter {n} in session {sid.hex()}: a replayed or reordered message")
        self._last[sid] = n
        return sid

    def verify_packed(self, frames: list[Any]) -> tuple[bytes, memoryview, list[Any]]:
        """Inverse of :meth:`Outbound.sign_packed`: ``(session id, body, extra)``, or :class:`AuthError`."""
        first = memoryview(getattr(frames[0], "buffer", frames[0])) if frames else memoryview(b"")
        if first.nbytes < PREFIX_LEN:
            self.log.refused(_peer(frames), "message too short to carry a MAC")
            raise AuthError("message too short to carry a MAC")
        body, extra = first[PREFIX_LEN:], frames[1:]
        sid = self._check(first[:MAC_LEN], first[MAC_LEN:PREFIX_LEN], [body, *extra], frames)
        return sid, body, extra

    def open_one(self, frame: Any) -> tuple[bytes, memoryview]:
        """:meth:`verify_packed` of a one-frame message, in one Python frame: ``(session id, body)``, or
        :class:`AuthError`. The same checks in the same order (length, MAC, then freshness)."""
        first = memoryview(getattr(frame, "buffer", frame))
        if first.nbytes < PREFIX_LEN:
            self.log.refused(_peer([frame]), "message too short to carry a MAC")
            raise AuthError("message too short to carry a MAC")
        hdr, body = first[MAC_LEN:PREFIX_LEN], first[PREFIX_LEN:]
        h = self._keyed.copy()
        h.update(b"".join((hdr, _ONE_FRAME, body.nbytes.to_bytes(8, "little"))))
        h.update(body)
        if not hmac.compare_digest(first[:MAC_LEN], h.digest()):
            self.log.refused(_peer([frame]), _BAD_MAC)
            raise AuthError(_BAD_MAC)
        sid = bytes(hdr[:SID_LEN])
        n = int.from_bytes(hdr[SID_LEN:], "little")
        if n <= self._last.get(sid, 0):
            self.log.replayed(_peer([frame]))
            raise AuthError(f"stale counter {n} in session {sid.hex()}: a replayed or reordered message")
        self._last[sid] = n
        return sid, body

    def verify(self, frames: list[Any]) -> tuple[bytes, list[Any]]:
        """Inverse of :meth:`Outbound.sign`: ``(session id, payload frames)``, or :class:`AuthError`."""
        first = memoryview(getattr(frames[0], "buffer", frames[0])) if frames else memoryview(b"")
        if len(frames) < 2 or first.nbytes != PREFIX_LEN:
            self.log.refused(_peer(frames), "message too short to carry a MAC")
            raise AuthError("message too short to carry a MAC")
        body = frames[1:]
        return self._check(first[:MAC_LEN], first[MAC_LEN:], body, frames), body

    def reply_outbound(self, sid: bytes) -> Outbound:
        """The session this side uses to answer requester ``sid`` on the same connection."""
        out = self._replies.get(sid)
        if out is None:
            out = self._replies[sid] = Outbound(derive(self._key, b"reply", sid))
        return out


def _peer(frames: Any) -> str:
    """The remote address of a received message (only looked up on the refusal path)."""
    try:
        return str(frames[0].get("Peer-Address"))
    except Exception:
        return "?"
