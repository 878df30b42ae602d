"""Any-host reader: chunked zero-copy frames over pyzmq from the publisher's :class:`SyncServer`.

Why chunked and pipelined: a read asks for a group of chunks and the server streams
one reply per chunk, each a frame pointing into its slot (no copy on the sending
side); with two groups outstanding the TCP pipe never drains. The reader
receives each chunk into its place in one reusable staging buffer, checksums it while
the next ones arrive, and the Subscriber copies into the target only once every
tensor is verified.

Why a window: every chunk asked for and not yet received may sit in the reader's memory, in
libzmq's receive queue, whenever the reader's thread falls behind the wire (a busy generator, a
slow checksum). Two groups of 32 chunks of 8 MiB let that reach 512 MiB besides the staging
buffer; the requests now ask for at most ``RLMESH_WEIGHTS_TCP_WINDOW_MIB`` (64 MiB) together
(:func:`window_plan`), which pulls 256 MiB over loopback as fast. Chunks never land in the
target itself: a torn or corrupt version must not reach it, so the staging buffer stays.

The same control channel carries RDMA and CUDA IPC setup (:class:`Control`).
"""

from __future__ import annotations

import itertools
import json
import logging
import mmap
import threading
import time
from typing import Any

import numpy as np
import zmq

from rlmesh import settings
from rlmesh.transport import Authenticator, AuthError, connect_channel, zmq_context
from rlmesh.transport.sockets import tune
from rlmesh.weights import checksum
from rlmesh.weights.base import Fetched
from rlmesh.weights.errors import WeightSyncError
from rlmesh.weights.layout import ALIGN, Manifest, plan_chunks

logger = logging.getLogger(__name__)

MiB = 1 << 20
CHUNK_BYTES = 8 << 20  # the largest chunk: one zmq frame, one recv_into
MIN_CHUNK_BYTES = 64 << 10
REQUESTS = 2  # read requests in flight: one streams while the next is asked for
# A small request unanswered this long means the publisher is gone or restarted: the
# Subscriber then re-reads its directory record and retries until its own timeout.
CONTROL_TIMEOUT = 3.0


class Control:
    """A DEALER to one publisher: signed JSON requests, replies matched by request id."""

    def __init__(self, record: dict[str, Any]):
        self.addr = record["tcp"]
        self.pub_name = record["name"]
        if not self.addr:
            raise WeightSyncError(f"publisher of {self.pub_name!r} serves no network readers (transports excludes tcp)")
        self._sock = tune(zmq_context().socket(zmq.DEALER))
        try:
            self._out = connect_channel(self._sock, Authenticator.from_env(), self.addr)
        except BaseException:
            self._sock.close(0)
            raise
        self._replies = self._out.reply_inbound(f"weights {self.pub_name!r} replies")
        self._rid = itertools.count(1)
        self._waiting: set[int] = set()  # requests whose replies someone will ask for
        self._early: dict[int, tuple[dict[str, Any], list[Any]]] = {}  # replies that came before their turn

    def send(self, req: dict[str, Any], reply: bool = True) -> int:
        rid = next(self._rid)
        req = {**req, "rid": rid}
        self._sock.send_multipart(self._out.sign([json.dumps(req).encode()]), copy=False)
        if reply:
            self._waiting.add(rid)
        return rid

    def forget(self) -> None:
        """Abandon every outstanding request (after an error): their replies will be dropped."""
        self._waiting.clear()
        self._early.clear()

    def recv(self, rid: int, timeout: float) -> tuple[dict[str, Any], list[Any]]:
        """The reply to ``rid``; replies to other outstanding requests are kept, stale ones dropped."""
        if rid in self._early:
            self._waiting.discard(rid)
            return self._early.pop(rid)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(left * 1000) + 1):
                raise WeightSyncError(f"publisher of {self.pub_name!r} at {self.addr} did not answer within {timeout:.3g} s")
            frames = self._sock.recv_multipart(copy=False)
            try:
                _, body = self._replies.verify(frames)
            except AuthError:
                continue  # counted, and logged at most once per interval, by the channel
            try:
                reply = json.loads(bytes(body[0].buffer))
            except ValueError as exc:
                logger.warning("weights %r: dropped a malformed reply: %s", self.pub_name, exc)
                continue
            got = reply.get("rid")
            if got == rid:
                self._waiting.discard(rid)
                return reply, body[1:]
            if got in self._waiting:
                self._early[got] = (reply, body[1:])

    def call(self, req: dict[str, Any], timeout: float) -> tuple[dict[str, Any], list[Any]]:
        return self.recv(self.send(req), timeout)

    def versions(self, timeout: float = CONTROL_TIMEOUT) -> list[int]:
        reply, _ = self.call({"op": "latest"}, timeout)
        return [int(v) for v in reply["versions"]]

    def open(self, min_version: int, version: int | None, timeout: float, want: tuple[str, ...] = ()
             ) -> tuple[int, Manifest, dict[str, Any]] | None:
        reply, frames = self.call({"op": "open", "min_version": min_version, "version": version, "want": list(want)},
                                  min(timeout, CONTROL_TIMEOUT))
        if not reply.get("ok"):
            if reply.get("error") == "none":
                return None
            raise WeightSyncError(f"publisher of {self.pub_name!r} refused to open a version: {reply.get('error')}")
        return int(reply["lease"]), Manifest.from_bytes(frames[0].buffer), reply.get("extra") or {}

    def release(self, lease: int) -> None:
        self.send({"op": "close", "lease": lease}, reply=False)  # its reply is dropped as stale

    def close(self) -> None:
        self._sock.close(0)


def window_plan(window_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> tuple[int, int]:
    """``(chunk bytes, chunks per request)`` so that the :data:`REQUESTS` requests in flight ask for
    at most ``window_bytes`` together: chunks of ``chunk_bytes`` unless the window holds fewer than
    two per request (then smaller, down to :data:`MIN_CHUNK_BYTES`, a multiple of the layout's
    alignment), and as many per request as the window's share holds (one at least)."""
    chunk = min(chunk_bytes, window_bytes // (2 * REQUESTS)) // ALIGN * ALIGN
    chunk = max(MIN_CHUNK_BYTES, chunk)
    return chunk, max(1, window_bytes // (REQUESTS * chunk))


class TcpReader(Control):
    """Pulls a version in chunks straight into one reusable staging buffer (``recv_into``).

    Why a staging buffer rather than keeping zmq frames: a fresh 1 GiB of frames per
    pull is fresh memory, and faulting it in cost more than the copy out of libzmq's
    buffer; the staging pages stay mapped from one version to the next.

    Swap, not copy: when the Subscriber points a module's tensors at a verified staging
    buffer (:meth:`Fetched.adopt`), that buffer is the module's now, and the next pull
    receives into another one: the buffer the module let go of, once nothing uses it any
    more (two buffers alternate, the memory a copy into the module's own tensors took too).
    """

    name = "tcp"

    def __init__(self, record: dict[str, Any], window_bytes: int | None = None):
        super().__init__(record)
        self.window_bytes = settings.WEIGHTS_TCP_WINDOW_MIB.get() * MiB if window_bytes is None else window_bytes
        self.chunk_bytes, self.group = window_plan(self.window_bytes)
        self._staging: Any = None
        self._handed: list[Any] = []  # staging buffers a module took over (reused once nothing else holds them)
        self._reserved = int(record.get("reserved") or 0)
        self._warming: threading.Thread | None = None

    def warm(self) -> int:
        """Allocate the staging buffer for the size the publisher reserved, and fault its pages in on a
        thread, so that the first pull only receives (its fresh pages cost ~1.3 s more than a later
        pull at 1 GiB on a loaded 2-core VM). The first pull waits for what is still in flight.
        Returns the bytes being readied (0: the publisher reserved nothing)."""
        if self._reserved <= 0 or self._warming is not None or self._staging is not None:
            return 0
        buf = self._stage(self._reserved)

        def touch() -> None:
            buf.view(-1)[:: mmap.PAGESIZE].zero_()  # a write fault per page: torch.empty leaves them unmapped

        self._warming = threading.Thread(target=touch, name=f"rlmesh-weights-stage-{self.pub_name}", daemon=True)
        self._warming.start()
        return self._reserved

    def _stage(self, nbytes: int) -> Any:
        import torch  # deferred: torch is heavy; weights of numpy arrays never load it

        if self._warming is not None:
            self._warming.join()
            self._warming = None
        if self._staging is None:
            free = [b for b in self._handed if _unshared(b)]
            if free:  # the buffer a module let go of: take it (and drop any other unused one)
                self._staging = free[0]
                self._handed = [b for b in self._handed if all(b is not f for f in free)]
        if self._staging is None or self._staging.numel() < nbytes:
            self._staging = None
            self._staging = torch.empty(nbytes, dtype=torch.uint8)
        return self._staging

    def _adopted(self, buf: Any) -> None:
        """A module now uses ``buf``: never receive into it again while anything else holds it."""
        if self._staging is buf:
            self._staging = None
            self._handed.append(buf)

    def _recv_chunk(self, pending: dict[tuple[int, int], int], chunks: list[tuple[int, int]], staging: np.ndarray,
                    deadline: float) -> tuple[tuple[int, int], dict[str, Any]]:
        """Receive one reply; a data frame for a pending read lands in its place in ``staging``."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(left * 1000) + 1):
                raise WeightSyncError(f"publisher of {self.pub_name!r} at {self.addr} stopped sending chunks")
            mac = self._sock.recv()
            if not self._sock.getsockopt(zmq.RCVMORE):
                continue
            head = self._sock.recv()
            try:
                reply = json.loads(head)  # JSON only, never pickle; authenticated below before use
            except ValueError:
                reply = {}
            rid = (reply.get("rid"), reply.get("i"))
            parts: list[Any] = [head]
            while self._sock.getsockopt(zmq.RCVMORE):
                if rid in pending and len(parts) == 1:
                    off, n = chunks[pending[rid]]
                    dst = memoryview(staging[off : off + n])  # type: ignore[arg-type]  # a numpy array is a buffer
                    got = self._sock.recv_into(dst)
                    if got != n:
                        raise WeightSyncError(f"chunk {off}+{n} of {self.pub_name!r} arrived with {got} bytes")
                    parts.append(dst)
                else:
                    self._sock.recv_into(bytearray())  # not ours (stale): discard
            if rid not in pending:
                continue
            try:
                self._replies.verify([mac, *parts])
            except AuthError as exc:
                raise WeightSyncError(f"a chunk from {self.addr} failed authentication: {exc}") from None
            return rid, reply

    def fetch(self, min_version: int, version: int | None, timeout: float) -> Fetched | None:
        t0 = time.perf_counter()
        opened = self.open(min_version, version, timeout)
        if opened is None:
            return None
        lease, manifest, _ = opened
        try:
            chunks, pieces = plan_chunks(manifest, self.chunk_bytes)
            by_chunk: list[list[Any]] = [[] for _ in chunks]
            for ps in pieces:
                for p in ps:
                    by_chunk[p.chunk].append(p)
            staging = self._stage(manifest.total)
            raw = staging.numpy()
            sums = [0] * len(pieces)
            pending: dict[tuple[int, int], int] = {}  # (request id, position in it) -> chunk index
            g = self.group
            groups = iter([list(range(i, min(i + g, len(chunks)))) for i in range(0, len(chunks), g)])

            def request(group: list[int] | None) -> None:
                if group:
                    rid = self.send({"op": "read", "lease": lease, "ranges": [chunks[i] for i in group]}, reply=False)
                    pending.update({(rid, k): idx for k, idx in enumerate(group)})

            for _ in range(REQUESTS):
                request(next(groups, None))
            deadline = time.monotonic() + timeout
            while pending:
                key, reply = self._recv_chunk(pending, chunks, raw, deadline)
                if not reply.get("ok"):
                    raise WeightSyncError(f"reading version {manifest.version} of {self.pub_name!r} failed: {reply.get('error')}")
                idx = pending.pop(key)
                if not any(k[0] == key[0] for k in pending):  # that request is complete: ask for the next group
                    request(next(groups, None))
                # Checksum this chunk while it is in cache and the next ones are on the wire.
                base = chunks[idx][0]
                for p in by_chunk[idx]:
                    sums[p.entry] += checksum.sum64(raw[base + p.start : base + p.start + p.length])
            sources = [[staging[chunks[p.chunk][0] + p.start : chunks[p.chunk][0] + p.start + p.length] for p in ps]
                       for ps in pieces]
        except BaseException:
            self.forget()
            self.release(lease)
            raise
        return Fetched(manifest, sources, lambda: self.release(lease), time.perf_counter() - t0,
                       [x & checksum.MASK for x in sums], adopt=lambda: self._adopted(staging))


def _unshared(buf: Any) -> bool:
    """True when no tensor but ``buf`` itself uses its memory (so receiving into it harms nobody).

    Reads the storage's reference count (torch's ``_storage_Use_Count``): ``buf`` holds one and the
    storage object asked for it one more. Where torch lacks it, a buffer is never reused (correct,
    only slower: each pull then faults in fresh memory)."""
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return False
    storage = buf.untyped_storage()
    return count(storage._cdata) <= 2
