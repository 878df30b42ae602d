"""Chunks over the authenticated transport, along a pipelined chain: source -> host0 -> host1 -> ...

Why a chain: each host forwards a chunk to the next as soon as it has stored (and
verified) it, so the source sends every byte once and the time to N hosts is about
the time to one plus N hops of one chunk. A :class:`ChunkServer` answers two
requests on one ROUTER channel: ``manifest`` and ``get`` (a list of hashes). The chunks
it holds go back several to a message (up to ~1 MiB: a tree of small files is not one
message per file); a hash it does not hold yet is parked and sent the moment
:meth:`ChunkServer.arrived` announces it. A :class:`Receiver` asks its upstream only for the chunks its store
lacks, verifies each before storing it, and then materialises the tree.

Between hosts with RDMA devices the chunks themselves skip the channel: a receiver opens a
window on its upstream (``onesided`` request), and each reply then says where in that window
its batch lies; the receiver READs it, verifies and stores it as before, and acknowledges it
(:mod:`rlmesh.workspace.onesided`). A link where that is refused stays on TCP.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

import zmq

from rlmesh.transport import Authenticator, AuthError, bind_channel, connect_channel, zmq_context
from rlmesh.transport.sockets import tune
from rlmesh.workspace.manifest import Kind, Manifest
from rlmesh.workspace.onesided import ChunkTransport, transport_from_env
from rlmesh.workspace.onesided_io import OneSidedError, Puller, Window, new_puller, open_window
from rlmesh.workspace.store import ChunkStore, CorruptChunkError, chunk_hash, materialise, placement

logger = logging.getLogger(__name__)

GROUP_BYTES = 16 << 20  # one get request asks for about this much
WINDOW = 3  # get requests in flight: the pipe never drains, memory per hop stays ~ WINDOW * GROUP_BYTES
BATCH_BYTES = 1 << 20  # a reply carries the chunks held now up to about this much (small files: many per message)
BATCH_CHUNKS = 512
MAX_WINDOWS = 8  # one-sided windows a server holds open (one per downstream peer; a chain has one)


class WorkspaceSyncError(RuntimeError):
    """A sync could not complete (upstream silent, corrupt data); chunks already stored are kept."""


@dataclass
class SyncStats:
    """What one receiver did in one sync (a ``file_syncs`` row)."""

    files: int = 0
    files_written: int = 0
    files_skipped: int = 0
    bytes_total: int = 0
    bytes_received: int = 0
    chunks_received: int = 0
    chunks_deduplicated: int = 0
    duration_s: float = 0.0
    transport: str = "tcp"
    relinks: int = 0  # times the upstream was replaced (its host died, or its pull failed, during the sync)
    error: str = ""


class ChunkServer:
    """Serves a manifest and chunks (``lookup(hash) -> bytes | None``) on an authenticated ROUTER channel."""

    def __init__(self, manifest_json: bytes | None, lookup: Callable[[str], bytes | None],
                 auth: Authenticator | None = None, host: str | None = None):
        self.manifest_json = manifest_json
        self._lookup = lookup
        self._sock = tune(zmq_context().socket(zmq.ROUTER))
        self.addr, self._in = bind_channel(self._sock, auth or Authenticator.from_env(), "workspace chunks", host)
        self._wake_addr = f"inproc://rlmesh-ws-{id(self)}"
        self._wake_pull = zmq_context().socket(zmq.PULL)
        self._wake_pull.bind(self._wake_addr)
        self._wake_lock = threading.Lock()
        self._wake_push = zmq_context().socket(zmq.PUSH)
        self._wake_push.connect(self._wake_addr)
        self._parked: dict[str, list[tuple[bytes, object, object]]] = {}  # hash ("" = manifest) -> who waits
        self._stop = threading.Event()
        self.bytes_sent = 0
        self._windows: dict[bytes, Window] = {}  # downstream peer -> its one-sided window
        self._held: dict[bytes, list[tuple[object, object, list[str], list[bytes]]]] = {}  # batches awaiting ring room
        self._thread = threading.Thread(target=self._run, name="rlmesh-workspace-server", daemon=True)
        self._thread.start()

    def arrived(self, *hashes: str) -> None:
        """Chunks (none: the manifest) became available: requests parked for them are answered. Thread-safe."""
        with self._wake_lock:
            self._wake_push.send("\n".join(hashes).encode())

    def _send_available(self, ident: bytes, out: object, rid: object, hashes: list[str]) -> None:
        """Answer a ``get``: the chunks held now go several to a message (one MAC, one send per
        ~``BATCH_BYTES``: a tree of small files is not a message per file), the rest are parked."""
        batch: list[str] = []
        datas: list[bytes] = []
        size = 0
        for h in hashes:
            data = self._lookup(h)
            if data is None:
                self._parked.setdefault(h, []).append((ident, out, rid))
                continue
            batch.append(h)
            datas.append(data)
            size += len(data)
            if size >= BATCH_BYTES or len(batch) >= BATCH_CHUNKS:
                self._send_batch(ident, out, rid, batch, datas)
                batch, datas, size = [], [], 0
        if batch:
            self._send_batch(ident, out, rid, batch, datas)

    def _send_batch(self, ident: bytes, out: object, rid: object, batch: list[str], datas: list[bytes]) -> None:
        win = self._windows.get(ident)
        if win is not None and sum(len(d) for d in datas) <= win.ring.capacity:
            if self._held.get(ident):  # batches before it still wait for room: keep their order
                self._held[ident].append((out, rid, batch, datas))
                return
            placed = win.place(datas)
            if placed is None:
                self._held.setdefault(ident, []).append((out, rid, batch, datas))
                return
            seq, at = placed
            head = json.dumps({"rid": rid, "hs": batch, "seq": seq, "at": at}).encode()
            self._sock.send_multipart([ident, *out.sign([head])], copy=False)
            self.bytes_sent += sum(n for _, n in at)
            return
        head = json.dumps({"rid": rid, "hs": batch}).encode()
        self._sock.send_multipart([ident, *out.sign([head, *datas])], copy=False)
        self.bytes_sent += sum(len(d) for d in datas)

    def _open_window(self, ident: bytes, out: object, req: dict) -> None:
        """A downstream peer asks to READ its chunks: open a window, or say why not (it stays on TCP)."""
        self._close_window(ident)
        try:
            if len(self._windows) >= MAX_WINDOWS:
                raise OneSidedError(f"this host already serves {MAX_WINDOWS} one-sided peers")
            win = open_window(req)
        except OneSidedError as exc:
            reply = {"onesided": False, "error": str(exc)}
        else:
            self._windows[ident] = win
            reply = {"onesided": True, "window": win.describe()}
        self._sock.send_multipart([ident, *out.sign([json.dumps(reply).encode()])])

    def _ack(self, ident: bytes, seq: int) -> None:
        """The peer has read batch ``seq``: its room goes to the batches held back, in order."""
        win = self._windows.get(ident)
        if win is None:
            return
        win.ack(seq)
        held = self._held.pop(ident, [])
        for i, (out, rid, batch, datas) in enumerate(held):
            placed = win.place(datas)
            if placed is None:
                self._held[ident] = held[i:]
                return
            s, at = placed
            head = json.dumps({"rid": rid, "hs": batch, "seq": s, "at": at}).encode()
            self._sock.send_multipart([ident, *out.sign([head])], copy=False)
            self.bytes_sent += sum(n for _, n in at)

    def _close_window(self, ident: bytes) -> None:
        win = self._windows.pop(ident, None)
        held = self._held.pop(ident, [])
        if win is not None:
            win.close()
        for out, rid, batch, datas in held:  # a peer that re-opens gets them over TCP: nothing is lost
            self._send_batch(ident, out, rid, batch, datas)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_pull, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(200))
                if self._wake_pull in ready:
                    woke = set()
                    while self._wake_pull.poll(0):
                        woke.update(self._wake_pull.recv().decode().split("\n"))
                    self._unpark(woke)
                if self._sock not in ready:
                    continue
                frames = self._sock.recv_multipart(copy=False)
                try:
                    sid, payload = self._in.verify(frames[1:])
                    req = json.loads(bytes(payload[0].buffer))
                except (AuthError, ValueError, IndexError):
                    continue  # refused and counted by the channel; never decoded further
                ident, out = frames[0].bytes, self._in.reply_outbound(sid)
                if req.get("op") == "manifest":
                    if self.manifest_json is None:
                        self._parked.setdefault("", []).append((ident, out, None))
                    else:
                        self._sock.send_multipart([ident, *out.sign([self.manifest_json])])
                elif req.get("op") == "get":
                    self._send_available(ident, out, req.get("rid"), [str(h) for h in req.get("hashes", [])])
                elif req.get("op") == "onesided":
                    self._open_window(ident, out, req)
                elif req.get("op") == "ack":
                    self._ack(ident, int(req.get("seq", -1)))
                elif req.get("op") == "onesided_close":
                    self._close_window(ident)
        finally:
            for ident in list(self._windows):
                self._windows.pop(ident).close()
            self._sock.close(0)
            self._wake_pull.close(0)

    def _unpark(self, woke: set[str]) -> None:
        """Answer the requests waiting for what just arrived: only those hashes are looked up (a
        downstream host asks for everything at once, so thousands may wait; retrying them all on
        every arrival made a chain of small files quadratic)."""
        wanted: dict[tuple, tuple[bytes, object, object, list[str]]] = {}
        for h in woke:
            waiting = self._parked.pop(h, [])
            if h == "":
                if self.manifest_json is None:
                    self._parked[""] = waiting
                    continue
                for ident, out, _ in waiting:
                    self._sock.send_multipart([ident, *out.sign([self.manifest_json])])
                continue
            for ident, out, rid in waiting:  # grouped per waiting request: answered in batches, as a get is
                wanted.setdefault((ident, id(out), rid), (ident, out, rid, []))[3].append(h)
        for ident, out, rid, hashes in wanted.values():
            self._send_available(ident, out, rid, hashes)  # whatever is still not held is parked again

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._wake_lock:
            self._wake_push.close(0)


def source_lookup(root: str, manifest: Manifest,
                  extra_roots: dict[str, str] | None = None) -> Callable[[str], bytes | None]:
    """Chunks of the controller's tree, read from the files themselves (no copy into a store).

    ``extra_roots``: manifest prefix -> the folder its entries come from (editable installs)."""
    where: dict[str, tuple[str, int, int]] = {}
    extras = sorted((extra_roots or {}).items(), key=lambda kv: -len(kv[0]))

    def source(path: str) -> str:
        for prefix, folder in extras:
            if path.startswith(prefix + "/"):
                return os.path.join(folder, *path[len(prefix) + 1:].split("/"))
        return os.path.join(root, *path.split("/"))

    for e in manifest.entries:
        if e.kind == Kind.FILE:
            for i, h in enumerate(e.chunks):
                where.setdefault(h, (source(e.path), i * manifest.chunk_bytes,
                                     min(manifest.chunk_bytes, e.size - i * manifest.chunk_bytes)))

    def lookup(h: str) -> bytes | None:
        hit = where.get(h)
        if hit is None:
            return None
        with open(hit[0], "rb") as f:
            f.seek(hit[1])
            return f.read(hit[2])

    return lookup


class HotChunks:
    """Small chunks that arrived in this receiver's pulls (verified), kept in memory to forward.

    Why: a host forwards every chunk it receives. For a tree of small files, reading each one back
    from the store (open, read, close, and Python around them) was about as much CPU per file as
    storing it. Only chunks up to ``max_chunk`` bytes are kept, up to ``cap`` bytes in all, the
    oldest dropped first (those are read from the store again). Big chunks cost per byte, not per
    chunk, and come from the page cache."""

    def __init__(self, cap: int = 64 << 20, max_chunk: int = 256 << 10) -> None:
        self.cap, self.max_chunk = cap, max_chunk
        self._chunks: dict[str, bytes] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def add(self, h: str, data: bytes | memoryview) -> None:
        if len(data) > self.max_chunk:
            return
        data = data if isinstance(data, bytes) else bytes(data)  # a one-sided read's view is reused: copy
        with self._lock:
            if h in self._chunks:
                return
            self._chunks[h] = data
            self._bytes += len(data)
            while self._bytes > self.cap:
                self._bytes -= len(self._chunks.pop(next(iter(self._chunks))))

    def get(self, h: str) -> bytes | None:
        with self._lock:
            return self._chunks.get(h)


def store_lookup(store: ChunkStore, fresh: set[str] | None = None,
                 hot: HotChunks | None = None) -> Callable[[str], bytes | None]:
    """Chunks from a host's store, re-hashed before they are forwarded (a chunk edited in place through
    a destination link is never passed on), except those in ``fresh``: hashed on arrival in this sync.
    Those still in ``hot`` (small ones, in memory since they arrived) are not read at all."""
    fresh = fresh if fresh is not None else set()

    def lookup(h: str) -> bytes | None:
        if hot is not None:
            data = hot.get(h)
            if data is not None:
                return data
        try:
            return store.read(h) if h in fresh else store.read_verified(h)
        except (OSError, CorruptChunkError):
            return None

    return lookup


class Receiver:
    """One host's end of a sync: serves downstream from its store while it pulls from upstream.

    :meth:`relink` points a pull in progress at another upstream (its upstream's host died):
    the chunks already stored are kept, and what was asked for and not yet received is asked
    of the new upstream, so a dead host in the chain costs the hosts after it one reconnect.
    """

    def __init__(self, store: ChunkStore, dest: str, auth: Authenticator | None = None, host: str | None = None,
                 transport: ChunkTransport | str | None = None):
        self.store, self.dest = store, dest
        self.transport = transport_from_env() if transport is None else ChunkTransport(transport)
        self._auth = auth or Authenticator.from_env()
        self._fresh: set[str] = set()  # verified on arrival in the current pull: forwarded without re-hashing
        self._hot = HotChunks()
        self.server = ChunkServer(None, store_lookup(store, self._fresh, self._hot), self._auth, host)
        self.addr = self.server.addr
        self._relink_to: str | None = None
        self._relink_lock = threading.Lock()

    def relink(self, upstream: str) -> None:
        """Continue the pull in progress from ``upstream`` instead (thread-safe; takes effect within ~0.1 s)."""
        with self._relink_lock:
            self._relink_to = upstream

    def _take_relink(self) -> str | None:
        with self._relink_lock:
            to, self._relink_to = self._relink_to, None
        return to

    def pull(self, upstream: str, timeout: float = 60.0) -> SyncStats:
        """Fetch what the store lacks from ``upstream``, then materialise into ``dest``.

        ``timeout`` bounds the wait for *progress* (any reply), not the whole sync.
        """
        t0 = time.perf_counter()
        st = SyncStats()
        link = _Link(self._auth, upstream)
        puller: Puller | None = None
        try:
            link.ask({"op": "manifest"})
            while True:
                mjson = self._next(link, st, timeout, lambda: link.ask({"op": "manifest"}))[0]
                if mjson is not None:
                    break
            manifest = Manifest.from_json(mjson)  # refuses escaping paths before anything is written
            self.server.manifest_json = mjson
            self.server.arrived()
            sizes = manifest.chunk_sizes()
            missing = self.store.missing(list(sizes))
            st.chunks_deduplicated = len(sizes) - len(missing)
            groups = _groups(missing, sizes)
            where = placement(manifest, missing)  # chunks of multi-chunk files: written into their file object
            pending: set[str] = set()
            verified: set[str] = set()
            gi = 0

            def open_onesided() -> Puller | None:  # asked before any get: the reply comes before theirs
                p = new_puller(self.transport) if missing else None
                if p is not None:
                    link.ask({"op": "onesided", **p.request()})
                st.transport = ChunkTransport.TCP.value
                return p

            puller = open_onesided()

            def ask_again() -> None:  # a new upstream: what the old one owed, in groups as before
                nonlocal puller
                if puller is not None:
                    puller.close()
                puller = open_onesided()
                for group in _groups(sorted(pending), sizes):
                    link.ask({"op": "get", "rid": -1, "hashes": group})

            while gi < len(groups) or pending:
                while gi < len(groups) and len(pending) < WINDOW * max(1, len(groups[0])):
                    link.ask({"op": "get", "rid": gi, "hashes": groups[gi]})
                    pending.update(groups[gi])
                    gi += 1
                reply = self._next(link, st, timeout, ask_again)
                if reply[0] is None:
                    continue
                head = json.loads(reply[0])
                if "onesided" in head:
                    puller = self._attach(puller, head, st, link)
                    continue
                hashes = head["hs"]  # every reply is a batch, parked chunks' too
                datas = reply[1:]
                if "at" in head:  # the batch lies in our window upstream: READ it, then let the room go
                    if puller is None:  # placed before our refusal of the window reached upstream: ask again
                        link.ask({"op": "get", "rid": -1, "hashes": [h for h in hashes if h in pending]})
                        continue
                    try:
                        datas = puller.read([(int(o), int(n)) for o, n in head["at"]])
                    except (OneSidedError, ValueError) as exc:
                        raise WorkspaceSyncError(f"one-sided read from upstream failed: {exc}") from exc
                    link.ask({"op": "ack", "seq": head["seq"]})
                if len(hashes) != len(datas):
                    raise WorkspaceSyncError(f"upstream sent {len(datas)} chunk(s) for {len(hashes)} hash(es)")
                stored = []
                for h, data in zip(hashes, datas):
                    if h not in pending:
                        continue
                    if h in where:  # verified: a corrupt chunk raises CorruptChunkError
                        self.store.put_in_object(h, data, *where[h])
                    else:
                        self.store.put(h, data)
                    self._fresh.add(h)
                    self._hot.add(h, data)
                    stored.append(h)
                    pending.discard(h)
                    verified.add(h)
                    st.chunks_received += 1
                    st.bytes_received += len(data)
                if stored:
                    self.server.arrived(*stored)  # downstream requests parked for these go out now
            res = materialise(manifest, self.store, self.dest, verified)
            st.files = sum(1 for e in manifest.entries if e.kind == Kind.FILE)
            st.files_written, st.files_skipped = res.files_written, res.files_unchanged
            st.bytes_total = manifest.total_bytes
        except Exception as exc:
            st.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if puller is not None:
                try:
                    link.ask({"op": "onesided_close"})
                except zmq.ZMQError:
                    pass  # the upstream is gone: its window went with it
                puller.close()
            st.duration_s = time.perf_counter() - t0
            link.close()
            self.last = st
        return st

    @staticmethod
    def _attach(puller: Puller | None, head: dict, st: SyncStats, link: "_Link") -> Puller | None:
        """The upstream's answer to our ``onesided`` request: READ from its window, or stay on TCP
        (a window opened that this host cannot use is closed, so upstream answers over TCP again)."""
        if puller is None:
            return None
        if head.get("onesided"):
            try:
                puller.attach(head["window"])
                st.transport = puller.kind.value
                return puller
            except (OneSidedError, KeyError, ValueError) as exc:
                why = str(exc)
                link.ask({"op": "onesided_close"})
        else:
            why = str(head.get("error", "refused"))
        logger.warning("workspace sync: %s from upstream not possible (%s); chunks come over TCP", puller.kind, why)
        puller.close()
        return None

    def _next(self, link: "_Link", st: SyncStats, timeout: float,
              ask_again: Callable[[], None]) -> list[bytes | None]:
        """The next reply from upstream; ``[None, None]`` after switching to a new upstream (whose
        requests ``ask_again`` has sent). Raises when no reply came for ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            to = self._take_relink()
            if to is not None:
                logger.warning("workspace sync: upstream %s replaced by %s", link.upstream, to)
                link.reconnect(to)
                st.relinks += 1
                ask_again()
                return [None, None]
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkspaceSyncError(f"upstream sent nothing for {timeout:.0f}s; chunks stored so far are kept")
            reply = link.recv(min(left, 0.1))
            if reply is not None:
                return reply

    def close(self) -> None:
        self.server.close()


def _groups(hashes: list[str], sizes: dict[str, int]) -> list[list[str]]:
    """``hashes`` cut into get requests of about ``GROUP_BYTES`` each."""
    groups, cur, n = [], [], 0
    for h in hashes:
        cur.append(h)
        n += sizes[h]
        if n >= GROUP_BYTES:
            groups.append(cur)
            cur, n = [], 0
    if cur:
        groups.append(cur)
    return groups


class _Link:
    """A receiver's authenticated DEALER channel to its current upstream."""

    def __init__(self, auth: Authenticator, upstream: str):
        self._auth = auth
        self.sock: zmq.Socket | None = None
        self.reconnect(upstream)

    def reconnect(self, upstream: str) -> None:
        self.close()
        self.upstream = upstream
        self.sock = tune(zmq_context().socket(zmq.DEALER))
        self.out = connect_channel(self.sock, self._auth, upstream)
        self.replies = self.out.reply_inbound("workspace replies")

    def ask(self, req: dict) -> None:
        self.sock.send_multipart(self.out.sign([json.dumps(req).encode()]))

    def recv(self, wait_s: float) -> list[bytes] | None:
        """One authenticated reply's frames, or None when none came within ``wait_s``."""
        if not self.sock.poll(int(wait_s * 1000)):
            return None
        frames = self.sock.recv_multipart(copy=False)
        try:
            _, body = self.replies.verify(frames)
        except AuthError:
            return None
        return [f.bytes for f in body]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None
