"""Socket helpers: one zmq context per process, binds that default to loopback.

:func:`bind_channel` and :func:`connect_channel` are how every rlmesh socket that
carries pickles or weights binds and dials: a channel bound off loopback (or with
``RLMESH_TRANSPORT_ENCRYPTION=always``) is a CurveZMQ server and advertises
``#c<nonce>``, and a dial to an address off loopback without CurveZMQ is refused.
Callers pass ``host`` explicitly to leave loopback (``RLMESH_BIND_HOST`` for workers).
"""

from __future__ import annotations

import os
import resource
import secrets
import select
import socket as _socket
import sys
import threading
from typing import Any

import zmq

from rlmesh import settings
from rlmesh.transport import curve
from rlmesh.transport.auth import CURVE_MODE, MAC_MODE, AuthError, Authenticator, is_loopback_address, split_address
from rlmesh.transport.channel import Inbound, Outbound

_ctx_lock = threading.Lock()
_ctx: zmq.Context | None = None
_ctx_pid = -1

BIND_HOST_ENV = settings.BIND_HOST.name
LOCAL_TRANSPORT_ENV = settings.LOCAL_TRANSPORT.name
ADVERTISE_HOST_ENV = settings.ADVERTISE_HOST.name


_POLLIN, _SNDMORE = int(zmq.POLLIN), int(zmq.SNDMORE)
_zmq_poll = zmq.backend.zmq_poll  # pyzmq's compiled zmq_poll


def has_message(sock: zmq.Socket) -> bool:
    """Whether ``sock`` has a message to read now (its FD is edge-triggered: drain until this is False).

    A zero-timeout ``zmq_poll``, not ``sock.get(zmq.EVENTS)``: libzmq answers both from the socket's
    ``ZMQ_EVENTS`` (processing its pending commands, which is what re-arms the FD), but pyzmq's ``get``
    first looks the option up in a Python enum (two Python frames): 1.35 against 1.55 µs, and the
    drains run this on every call and every reply."""
    return bool(_zmq_poll([(sock, _POLLIN)], 0))


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """``sock.recv_multipart(flags, copy=False)`` for the data plane's hot paths, at half the cost.

    Why: pyzmq's ``recv_multipart`` asks the socket ``RCVMORE`` after every frame, and each ask
    builds a ``SocketOption`` enum in Python; a frame already says whether more follow. Measured on
    a two-frame message: 2.7 µs with ``recv_multipart``, 1.25 µs here. Raises ``zmq.Again`` as it does
    (only for the first frame: a multipart message arrives whole)."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(flags, copy=False)
        frames.append(frame)
    return frames


_zmq_send = zmq.backend.Socket.send  # pyzmq's compiled send, beneath its Python wrappers


def send_frames(sock: zmq.Socket, frames: list[Any]) -> None:
    """``sock.send_multipart(frames, copy=False)`` for the data plane's hot paths, without pyzmq's two
    Python layers (``send_multipart``, then its ``send``, each checking arguments) above the compiled
    send: 1.7 µs a one-frame message there, 0.2 µs here.

    The same semantics: frames under pyzmq's copy threshold are copied, larger ones sent zero-copy, and a
    frame that is not a buffer raises ``TypeError`` before any frame of the message leaves (a message
    sent in part would be completed by the next one). ``frames`` is not empty."""
    last = len(frames) - 1
    if last:
        for f in frames:
            memoryview(f)  # every frame a buffer, or TypeError here: before the first frame is sent
        for i in range(last):
            _zmq_send(sock, frames[i], _SNDMORE, False, False)
    _zmq_send(sock, frames[last], 0, False, False)


def wait_readable(fds: list[int], timeout_s: float | None) -> list[int]:
    """The fds of ``fds`` readable within ``timeout_s`` (``None``: wait for one).

    ``poll``, not ``select``: a controller of 1,000 procs holds over 1,024 descriptors, and
    ``select`` refuses any fd numbered 1,024 or more ("filedescriptor out of range").
    """
    p = select.poll()
    for fd in fds:
        p.register(fd, select.POLLIN)
    return [fd for fd, _ in p.poll(poll_ms(timeout_s))]


def poll_ms(timeout_s: float | None) -> int | None:
    """``poll``'s timeout in whole milliseconds, rounded up (a wait never ends early); ``None`` waits forever."""
    return None if timeout_s is None else max(0, int(timeout_s * 1000 + 0.999))


def zmq_context() -> zmq.Context:
    """The process-wide zmq context (re-created after fork)."""
    global _ctx, _ctx_pid
    with _ctx_lock:
        if _ctx is None or _ctx_pid != os.getpid():
            _ctx = zmq.Context()
            _ctx_pid = os.getpid()
            _ctx.set(zmq.MAX_SOCKETS, max_sockets())
        return _ctx


def max_sockets() -> int:
    """zmq's default cap is 1,023 sockets per context; a controller holds one per proc it calls (and
    a proc one per peer), so a mesh of 1,000 procs needs more. Each socket takes about two file
    descriptors: allow what this process's descriptor limit can hold."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return 1023
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 16
    return max(1023, min(soft // 2, 1 << 16))


def local_transport() -> str:
    """``ipc`` (Linux abstract Unix sockets) or ``tcp`` for channels that only this host dials; see
    :func:`bind_channel`. ``ipc`` by default on Linux, ``tcp`` elsewhere (no abstract sockets)."""
    want = settings.LOCAL_TRANSPORT.get() or ("ipc" if sys.platform.startswith("linux") else "tcp")
    if want == "ipc" and not sys.platform.startswith("linux"):
        raise ValueError(f"{LOCAL_TRANSPORT_ENV}=ipc needs Linux (abstract Unix sockets); use 'tcp'")
    return want


def default_bind_host() -> str:
    return settings.BIND_HOST.get()


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
        adv = settings.ADVERTISE_HOST.get() or _socket.gethostbyname(_socket.gethostname())
    if ":" in adv and not adv.startswith("["):
        adv = f"[{adv}]"
    return f"tcp://{adv}:{port}"


RECONNECT_IVL_MAX_MS = 2000
"""zmq retries a connection that fails every 100 ms, forever; backing off to this bounds what a
socket to a peer that is gone costs until its owner closes it (a dead proc's address: see
``rlmesh.actor.client.ThreadSockets``), while a live peer behind a brief break is back within 2 s."""


MAX_MESSAGE_ENV = settings.MAX_MESSAGE_MB.name
MAX_MESSAGE_MB_DEFAULT = settings.MAX_MESSAGE_MB.default
_max_message: int | None = None


class MessageTooLarge(ValueError):
    """A frame is over the receiver's limit (``RLMESH_MAX_MESSAGE_MB``): refused before it is sent."""


def max_message_bytes() -> int:
    """The largest frame a call channel takes, bytes (``RLMESH_MAX_MESSAGE_MB``, default 256; read once).

    Why: calls are read before they are authenticated, so without a limit anyone who can reach a
    worker's socket makes it buffer a frame of any size (1 GiB raised a worker's RSS by 1 GB before
    the MAC refused it). libzmq checks ``ZMQ_MAXMSGSIZE`` against a frame's size header and drops the
    connection before buffering any of it. Large tensors travel on their own channels
    (``rlmesh.weights``, workspace sync), which this does not limit."""
    global _max_message
    if _max_message is None:
        _max_message = int(settings.MAX_MESSAGE_MB.get() * (1 << 20))
    return _max_message


def limit_messages(sock: zmq.Socket) -> zmq.Socket:
    """Refuse frames over :func:`max_message_bytes` on ``sock`` (set before it binds)."""
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes())
    return sock


def check_message_size(frames: list[Any], size: int, what: str) -> None:
    """Raise :class:`MessageTooLarge` when a frame of ``frames`` (``size`` bytes in all) is over the
    limit, naming ``what`` and the fix; free when ``size`` is under it (the usual case)."""
    limit = max_message_bytes()
    if size <= limit:
        return
    biggest = max(memoryview(getattr(f, "buffer", f)).nbytes for f in frames)
    if biggest > limit:
        raise MessageTooLarge(
            f"{what} has a {biggest / (1 << 20):.0f} MB frame, over the {limit / (1 << 20):.0f} MB a call channel "
            f"takes ({MAX_MESSAGE_ENV}); send large tensors through rlmesh.weights (Publisher/Subscriber), "
            f"or raise {MAX_MESSAGE_ENV} for the whole job (set it before the first spawn_procs)")


def tune(sock: zmq.Socket) -> zmq.Socket:
    """Settings every rlmesh socket shares: no linger on close, unbounded queues (backpressure is by
    futures), reconnection that backs off to ``RECONNECT_IVL_MAX_MS``."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    return sock


def bind_channel(sock: zmq.Socket, auth: Authenticator, name: str, host: str | None = None,
                 port: int | None = None, local: bool = False) -> tuple[str, Inbound]:
    """Bind ``sock`` as a fresh channel; returns ``(address peers dial, its Inbound)``.

    The address carries the channel's nonce and mode (``#m``: MAC on loopback, ``#c``:
    CurveZMQ + MAC), so whoever holds the address can talk to this incarnation only.

    ``local``: a channel only this host's processes dial (the actor data plane of local procs) binds
    a Linux abstract Unix socket instead of a loopback TCP port when nothing asks for a host (no
    ``host``, ``port`` or ``RLMESH_BIND_HOST``). It reaches exactly the processes a loopback port
    does (those of this network namespace) and costs the kernel less per message: a round trip of
    ``call_one`` ~20 µs less (docs/performance.md). ``RLMESH_LOCAL_TRANSPORT=tcp`` turns it off.
    """
    explicit = host or settings.BIND_HOST.raw()
    host = host or default_bind_host()
    secure = curve.always() or not is_loopback_address(f"tcp://{host}:0")
    if secure:
        curve.serve(sock, auth)
    if local and explicit is None and not secure and port is None and local_transport() == "ipc":
        addr = f"ipc://@rlmesh-{os.getpid()}-{secrets.token_hex(8)}"  # abstract: no file, gone at close
        unix_buffers(sock)
        sock.bind(addr)
    else:
        addr = bind_random(sock, host, port)
    inbound = auth.new_inbound(name)
    return f"{addr}#{CURVE_MODE if secure else MAC_MODE}{inbound.nonce.hex()}", inbound


def connect_channel(sock: zmq.Socket, auth: Authenticator, addr: str) -> Outbound:
    """Dial a channel address (CurveZMQ when it says so); returns a new session to sign with.

    Refuses (:class:`AuthError`) to send in clear to an address off loopback.
    """
    endpoint, _, mode = split_address(addr)
    if mode == CURVE_MODE:
        curve.dial(sock, auth)
    elif not is_loopback_address(endpoint):
        raise AuthError(f"refusing to send in clear to {endpoint}: off loopback every connection is CurveZMQ "
                        "(the address must come from an rlmesh socket, ending in #c...)")
    out = auth.outbound(addr)
    if endpoint.startswith("ipc://"):
        unix_buffers(sock)
    sock.connect(endpoint)
    return out


UNIX_BUFFER_BYTES = 4 << 20


def unix_buffers(sock: zmq.Socket) -> None:
    """Ask for 4 MiB kernel buffers on a Unix-socket connection (before it is made): a Unix socket's
    default (~208 KiB) is a fraction of what TCP's autotuning reaches, and bulk arguments (tensors,
    rollout batches) crossed it in more, smaller hops. The kernel caps it at ``net.core.wmem_max`` /
    ``rmem_max``."""
    sock.setsockopt(zmq.SNDBUF, UNIX_BUFFER_BYTES)
    sock.setsockopt(zmq.RCVBUF, UNIX_BUFFER_BYTES)
