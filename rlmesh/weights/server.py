"""The publisher's network endpoint: TCP data, plus RDMA and CUDA IPC connection setup.

Why one ROUTER thread: it answers small JSON requests (latest version, open a
version under a lease, read a group of chunks, close) and streams one reply per chunk
as a zero-copy frame that points straight into the slot memory, so the bytes on the wire are the bytes the
publisher wrote once; zmq's I/O thread does the sending, off the GIL. A lease keeps a
slot from being overwritten while a remote reader is still reading it.

Every request must carry this job's MAC and a fresh session counter
(``rlmesh.transport.channel``: a replayed request is dropped and counted); the body
is JSON, so nothing from the network is ever unpickled. Off loopback the connection
is CurveZMQ, which encrypts and authenticates every frame, data included.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Protocol, Sequence

import zmq

from rlmesh.transport import Authenticator, AuthError, bind_channel, zmq_context
from rlmesh.transport.sockets import tune

logger = logging.getLogger(__name__)


class LeaseSource(Protocol):
    """What the server reads from the :class:`~rlmesh.weights.publisher.Publisher` it serves.

    Why a protocol: the publisher creates its server, so the server must not import the
    publisher back (that was an import cycle); the publisher satisfies this as it is.
    """

    name: str

    def versions(self) -> list[int]:
        """The versions readable now, newest first."""

    def _open_lease(self, min_version: int, version: Any, want: Sequence[str]) -> tuple[int, bytes, dict[str, Any]] | None:
        """Lease ``version`` (else the newest >= ``min_version``): ``(lease, manifest, slot info)``, or None."""

    def _close_lease(self, lease: int) -> None:
        """Release a lease: its slot may be overwritten again."""

    def _read_views(self, lease: int, ranges: list[tuple[int, int]]) -> list[memoryview]:
        """Zero-copy views of byte ranges of the leased slot."""

    def _rdma_connect(self, qp: dict[str, Any]) -> dict[str, Any]:
        """Connect a reader's RDMA queue pair to the slot memory; returns this side's queue pair."""


class SyncServer:
    """Serves one :class:`Publisher` to TCP, RDMA and CUDA IPC readers from a daemon thread."""

    def __init__(self, pub: LeaseSource, host: str | None = None):
        self.pub = pub
        self._sock = tune(zmq_context().socket(zmq.ROUTER))
        self.addr, self._in = bind_channel(self._sock, Authenticator.from_env(), f"weights {pub.name!r}", host)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rlmesh-weights-{pub.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not poller.poll(100):
                    continue
                frames = self._sock.recv_multipart(copy=False)
                ident, body = frames[0], frames[1:]
                try:
                    sid, payload = self._in.verify(body)
                except AuthError:
                    continue  # counted, and logged at most once per peer per interval, by the channel
                try:
                    req = json.loads(bytes(payload[0].buffer))
                    req["_out"] = self._in.reply_outbound(sid)
                except (ValueError, UnicodeDecodeError, TypeError) as exc:
                    logger.warning("weights %r: dropped a request that failed authentication or decoding: %s", self.pub.name, exc)
                    continue
                try:
                    if req.get("op") == "read":
                        self._stream(ident, req)
                        continue
                    reply, bufs = self._handle(req)
                except Exception as exc:  # a bad request must not kill the server
                    logger.debug("weights %r: request %s failed", self.pub.name, req.get("op"), exc_info=True)
                    reply, bufs = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, []
                self._reply(ident, {**reply, "rid": req.get("rid")}, bufs, req["_out"])
        finally:
            self._sock.close(0)

    def _reply(self, ident: Any, reply: dict[str, Any], bufs: list[Any], session: Any) -> None:
        out = session.sign([json.dumps(reply).encode(), *bufs])
        self._sock.send_multipart([ident, *out], copy=False)

    def _stream(self, ident: Any, req: dict[str, Any]) -> None:
        """One reply per requested range, each a frame into the slot: no round trip between chunks."""
        rid = req.get("rid")
        try:
            views = self.pub._read_views(int(req["lease"]), [tuple(r) for r in req["ranges"]])
        except Exception as exc:
            self._reply(ident, {"ok": False, "rid": rid, "i": 0, "error": f"{type(exc).__name__}: {exc}"}, [],
                        req["_out"])
            return
        for i, view in enumerate(views):
            self._reply(ident, {"ok": True, "rid": rid, "i": i}, [view], req["_out"])

    def _handle(self, req: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        op = req.get("op")
        pub = self.pub
        if op == "latest":
            return {"ok": True, "versions": pub.versions()}, []
        if op == "open":
            got = pub._open_lease(int(req.get("min_version", 0)), req.get("version"), req.get("want", ()))
            if got is None:
                return {"ok": False, "error": "none", "versions": pub.versions()}, []
            lease, manifest, extra = got
            return {"ok": True, "lease": lease, "extra": extra}, [manifest]
        if op == "close":
            pub._close_lease(int(req["lease"]))
            return {"ok": True}, []
        if op == "rdma_connect":
            return {"ok": True, "qp": pub._rdma_connect(req["qp"])}, []
        raise ValueError(f"unknown op {op!r}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
