"""Socket helpers: one zmq context per process, binds that default to loopback.

Binding off loopback is allowed only through an :class:`Authenticator` in full mode;
callers pass ``host`` explicitly to leave loopback (``RLMESH_BIND_HOST`` for workers).
"""

from __future__ import annotations

import os
import socket as _socket
import threading

import zmq

_ctx_lock = threading.Lock()
_ctx: zmq.Context | None = None
_ctx_pid = -1

BIND_HOST_ENV = "RLMESH_BIND_HOST"
ADVERTISE_HOST_ENV = "RLMESH_ADVERTISE_HOST"


def zmq_context() -> zmq.Context:
    """The process-wide zmq context (re-created after fork)."""
    global _ctx, _ctx_pid
    with _ctx_lock:
        if _ctx is None or _ctx_pid != os.getpid():
            _ctx = zmq.Context()
            _ctx_pid = os.getpid()
        return _ctx


def default_bind_host() -> str:
    return os.environ.get(BIND_HOST_ENV, "127.0.0.1")


def bind_random(sock: zmq.Socket, host: str | None = None, port: int | None = None) -> str:
    """Bind ``sock`` to a free TCP port (or ``port``) on ``host`` (loopback by default); return the address peers dial.

    When bound to a wildcard (``0.0.0.0``), the advertised address uses
    ``RLMESH_ADVERTISE_HOST`` or this host's name.
    """
    host = host or default_bind_host()
    if port:
        sock.bind(f"tcp://{host}:{port}")
    else:
        port = sock.bind_to_random_port(f"tcp://{host}")
    adv = host
    if host in ("0.0.0.0", "*", "::"):
        adv = os.environ.get(ADVERTISE_HOST_ENV) or _socket.gethostbyname(_socket.gethostname())
    if ":" in adv and not adv.startswith("["):
        adv = f"[{adv}]"
    return f"tcp://{adv}:{port}"


def tune(sock: zmq.Socket) -> zmq.Socket:
    """Settings every rlmesh socket shares: no linger on close, unbounded queues (backpressure is by futures)."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock
