"""The job's keys: an unauthenticated or replayed message must never reach ``pickle.loads``.

One per-job secret, which the controller hands to the workers it starts
(environment, never argv; a Kubernetes Secret for pods), is the root of every key:

- per-channel MAC keys (:mod:`rlmesh.transport.channel`): keyed BLAKE2b-256 over
  each message with a per-session strictly increasing counter, so a forged, cut,
  replayed or reordered message is dropped and counted, never decoded. The MAC
  covers every frame under 64 KiB in full (the pickle headers, the only frames
  ever unpickled) and the sizes of larger raw buffer frames, read only as bytes;
- CurveZMQ keypairs (:mod:`rlmesh.transport.curve`) for every connection off
  loopback, which encrypt and authenticate every byte, buffers included.
"""

from __future__ import annotations

import functools
import ipaddress
import secrets
import socket

from rlmesh import settings
from rlmesh.transport.channel import NONCE_LEN, AuthError, Inbound, Outbound, derive
from rlmesh.transport.curve import CurveKeys

SECRET_ENV = settings.SECRET.name
MAC_MODE = "m"  # address fragment: plain zmq + MAC (loopback only)
CURVE_MODE = "c"  # address fragment: CurveZMQ + MAC

__all__ = ["AuthError", "Authenticator", "SECRET_ENV", "is_loopback_address", "split_address"]


def split_address(addr: str) -> tuple[str, bytes, str]:
    """``tcp://host:port#m<hex>`` -> ``("tcp://host:port", nonce, mode)``; a bare address has no nonce."""
    endpoint, sep, frag = addr.partition("#")
    if not sep:
        return endpoint, b"", ""
    try:
        nonce = bytes.fromhex(frag[1:])
    except ValueError:
        nonce = b""
    if frag[:1] not in (MAC_MODE, CURVE_MODE) or len(nonce) != NONCE_LEN:
        raise AuthError(f"malformed rlmesh address {addr!r}: expected tcp://HOST:PORT#m<32 hex> or #c<32 hex>")
    return endpoint, nonce, frag[0]


@functools.lru_cache(maxsize=1024)
def is_loopback_address(addr: str) -> bool:
    """True for ``tcp://127.x.x.x:port``, ``tcp://[::1]:port``, ``tcp://localhost:port``, ``ipc://`` and ``inproc://``."""
    addr = addr.partition("#")[0]
    if addr.startswith(("ipc://", "inproc://")):
        return True
    host = addr.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except OSError:
            return False


class Authenticator:
    """The job secret and what derives from it: channel keys, sessions, CurveZMQ keypairs."""

    def __init__(self, secret: bytes):
        if not secret:
            raise AuthError("an empty secret would let any peer in; pass the job's secret")
        self._key = secret
        self._curve: CurveKeys | None = None

    @classmethod
    def from_env(cls) -> "Authenticator":
        hexkey = settings.SECRET.get()
        if not hexkey:
            raise AuthError(f"{SECRET_ENV} is not set: workers get it from the controller that starts them")
        return cls(bytes.fromhex(hexkey))

    @staticmethod
    def new_secret() -> bytes:
        return secrets.token_bytes(32)

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one Authenticator per process, bounded cache
    def _channel_key(self, nonce: bytes) -> bytes:
        return derive(self._key, b"channel", nonce)

    def new_inbound(self, name: str) -> Inbound:
        """A fresh channel (a listening socket's receiving side) with its own random nonce."""
        nonce = secrets.token_bytes(NONCE_LEN)
        return Inbound(self._channel_key(nonce), name, nonce)

    def outbound(self, addr: str) -> Outbound:
        """A new session to the channel at ``addr`` (which carries the channel's nonce)."""
        _, nonce, _ = split_address(addr)
        if not nonce:
            raise AuthError(f"{addr!r} has no channel nonce (#m<hex>): it was not advertised by an rlmesh socket")
        return Outbound(self._channel_key(nonce))

    def curve_keys(self) -> CurveKeys:
        if self._curve is None:
            self._curve = CurveKeys(derive(self._key, b"curve-server"), derive(self._key, b"curve-client"))
        return self._curve
