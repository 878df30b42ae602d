"""CurveZMQ for every connection that leaves loopback: encrypted, authenticated both ways, replay-proof.

Why CurveZMQ and not TLS: it is zmq's own mechanism (libsodium, bundled with pyzmq),
so a socket becomes secure with a few options and no tunnel or proxy; each
connection gets fresh ephemeral keys (forward secrecy) and nonces, so nothing
captured from one connection can be replayed into another. The measured
comparison with TLS is in ``docs/actors.md`` (Security).

Keys are derived from the job secret (``RLMESH_SECRET``), so they reach workers and
pods exactly the way the secret does today and nothing new is handed out: one
server keypair (its public half never travels; a client must derive it) and one
client keypair, which a ZAP handler in each serving process checks, so a peer
without the secret cannot even complete the handshake.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

import zmq
import zmq.auth.thread
from zmq.utils import z85

from rlmesh import settings

logger = logging.getLogger(__name__)

ENCRYPTION_ENV = settings.TRANSPORT_ENCRYPTION.name  # "auto" (default): off loopback only; "always": loopback too

_zap_lock = threading.Lock()
_zap: dict[int, tuple[zmq.auth.thread.ThreadAuthenticator, "_JobClientsOnly"]] = {}  # per context


def always() -> bool:
    """True when ``RLMESH_TRANSPORT_ENCRYPTION=always`` forces CurveZMQ on loopback too."""
    return settings.TRANSPORT_ENCRYPTION.get() == "always"


class CurveKeys:
    """The job's two CurveZMQ keypairs (Z85), derived from the job secret."""

    def __init__(self, server_seed: bytes, client_seed: bytes):
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq has no CURVE support: install pyzmq's wheel (it bundles libsodium)")
        self.server_secret = z85.encode(server_seed)
        self.server_public = zmq.curve_public(self.server_secret)
        self.client_secret = z85.encode(client_seed)
        self.client_public = zmq.curve_public(self.client_secret)


class _JobClientsOnly:
    """ZAP credentials check: only the job's client key may connect (a set: tests hold several jobs)."""

    def __init__(self) -> None:
        self.allowed: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.allowed


def _ensure_zap(ctx: zmq.Context, keys: CurveKeys) -> None:
    """One ZAP handler thread per zmq context that serves CURVE (started on the first such bind)."""
    with _zap_lock:
        entry = _zap.get(id(ctx))
        if entry is None or entry[0].context is not ctx or not entry[0].is_alive():
            auth = zmq.auth.thread.ThreadAuthenticator(ctx, log=logging.getLogger("rlmesh.transport.zap"))
            auth.start()
            check = _JobClientsOnly()
            auth.configure_curve_callback("*", check)
            entry = _zap[id(ctx)] = (auth, check)
        entry[1].allowed.add(keys.client_public)


class KeySource(Protocol):
    """What CURVE set-up needs from an :class:`~rlmesh.transport.auth.Authenticator`: the job's keypairs.

    Why a protocol: ``auth`` imports this module for :class:`CurveKeys`, so this module must not
    import ``auth`` back (an import cycle the layer contract refuses).
    """

    def curve_keys(self) -> CurveKeys:
        """The job's server and client keypairs (derived from its secret)."""


def serve(sock: zmq.Socket, auth: KeySource) -> None:
    """Make ``sock`` a CURVE server (call before ``bind``); only job members can connect."""
    keys = auth.curve_keys()
    _ensure_zap(sock.context, keys)
    sock.curve_server = True
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public


def dial(sock: zmq.Socket, auth: KeySource) -> None:
    """Make ``sock`` a CURVE client of a job server (call before ``connect``)."""
    keys = auth.curve_keys()
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.client_public
    sock.curve_secretkey = keys.client_secret
