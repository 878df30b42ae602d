"""The serving side of a sync: a :class:`ChunkServer` answers ``manifest`` and ``get`` on one
authenticated ROUTER channel, from the controller's files (:func:`source_lookup`) or from a
host's store (:func:`store_lookup`, with :class:`HotChunks` for small chunks just received).

The chunks it holds go back several to a message (up to ~1 MiB: a tree of small files is not
one message per file); a hash it does not hold yet is parked and sent the moment
:meth:`ChunkServer.arrived` announces it. A downstream peer may instead open a one-sided window
(:mod:`rlmesh.workspace.onesided`): replies then say where in it each batch lies.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable

import zmq

from rlmesh.transport import Authenticator, AuthError, bind_channel, zmq_context
from rlmesh.transport.sockets import tune
from rlmesh.workspace.manifest import TreeManifest, pread_full
from rlmesh.workspace.onesided_io import OneSidedError, Window, open_window
from rlmesh.workspace.store import ChunkStore, CorruptChunkError

BATCH_BYTES = 1 << 20  # a reply carries the chunks held now up to about this much (small files: many per message)
BATCH_CHUNKS = 512
MAX_WINDOWS = 8  # one-sided windows a server holds open (one per downstream peer; a chain has one)


_HINTS = "\0hints"  # on the wake channel: hints were added (never a hash, never the manifest's "")
_RETRY = "\0retry"  # on the wake channel: look up every parked chunk again
HINT_KEEPALIVE_S = 1.0
"""While the walk runs, a subscriber hears at least this often (an empty batch if need be): a walk of big
files only, which gives no hints, must not look like a silent upstream to a receiver's timeout."""


class ChunkServer:
    """Serves a manifest and chunks (``lookup(hash) -> bytes | None``) on an authenticated ROUTER channel.

    ``walking=True`` (the source, created before its walk): a ``hints`` request subscribes to the small
    files' chunks as the walk hashes them (:meth:`hint`), ``[hash, size, mode]`` each, so the first host
    fetches them while the walk goes on, instead of waiting for the whole manifest; :meth:`publish` then
    serves the manifest (or :meth:`fail` says why there is none). Any other server answers ``hints``
    with an empty, final batch."""

    def __init__(self, manifest_json: bytes | None, lookup: Callable[[str], bytes | memoryview | None],
                 auth: Authenticator | None = None, host: str | None = None, walking: bool = False):
        self.manifest_json = manifest_json
        self.walking = walking
        self._hints: list[list[Any]] = []
        self._hint_subs: dict[bytes, tuple[Any, int, float]] = {}  # peer -> (its outbound, hints sent, when last)
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
        self.downstream = False
        """Whether a peer has asked this server for anything. A receiver keeps the chunks it receives in
        memory to forward (:class:`HotChunks`) only then: the chain's last host has nobody to forward to,
        and 64 MiB of frames held for nothing made every new frame fresh memory to fault in (~10 % of a
        64 MiB sync's time on one host)."""
        self._windows: dict[bytes, Window] = {}  # downstream peer -> its one-sided window
        self._held: dict[bytes, list[tuple[object, object, list[str], list[Any]]]] = {}  # batches awaiting ring room
        self._thread = threading.Thread(target=self._run, name="rlmesh-workspace-server", daemon=True)
        self._thread.start()

    def arrived(self, *hashes: str) -> None:
        """Chunks (none: the manifest) became available: requests parked for them are answered. Thread-safe."""
        with self._wake_lock:
            self._wake_push.send("\n".join(hashes).encode())

    def hint(self, items: list[list[Any]]) -> None:
        """The walk hashed these small files (``[hash, size, mode]`` each; ``lookup`` serves them now):
        sent on to the subscribers. Thread-safe."""
        if items:
            self._hints.extend(items)  # one list.extend: atomic; read by the server thread after the wake
            with self._wake_lock:
                self._wake_push.send(_HINTS.encode())

    def publish(self, manifest_json: bytes) -> None:
        """The walk is done: serve ``manifest_json`` (parked requests get it now), close the hints, and look
        up again every chunk parked while the lookup knew only the walk's small files."""
        self.manifest_json = manifest_json
        self.walking = False
        with self._wake_lock:
            self._wake_push.send("\n".join((_HINTS, _RETRY)).encode())
        self.arrived()

    def fail(self, why: str) -> None:
        """The walk failed: every request for the manifest, parked or to come, gets ``{"error": why}``,
        so the hosts waiting for it stop now rather than at their timeout."""
        self.publish(json.dumps({"error": why}).encode())

    def _send_hints(self, now: float, keepalive: bool = False) -> None:
        """Each subscriber's hints not sent yet (all of them, once the walk is done, with ``done``)."""
        n, done = len(self._hints), not self.walking
        for ident, (out, sent, last) in list(self._hint_subs.items()):
            if sent == n and not done and not (keepalive and now - last >= HINT_KEEPALIVE_S):
                continue
            head = json.dumps({"hints": self._hints[sent:n], "done": done}).encode()
            self._sock.send_multipart([ident, *out.sign([head])])
            if done:
                del self._hint_subs[ident]
            else:
                self._hint_subs[ident] = (out, n, now)

    def _send_available(self, ident: bytes, out: Any, rid: object, hashes: list[str]) -> None:
        """Answer a ``get``: the chunks held now go several to a message (one MAC, one send per
        ~``BATCH_BYTES``: a tree of small files is not a message per file), the rest are parked."""
        batch: list[str] = []
        datas: list[bytes | memoryview] = []
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

    def _send_batch(self, ident: bytes, out: Any, rid: object, batch: list[str], datas: list[Any]) -> None:
        win = self._windows.get(ident)
        if win is not None and sum(len(d) for d in datas) <= win.ring.capacity:
            if self._held.get(ident):  # batches before it still wait for room: keep their order
                self._held[ident].append((out, rid, batch, datas))
                return
            if not self._send_placed(win, ident, out, rid, batch, datas):
                self._held.setdefault(ident, []).append((out, rid, batch, datas))
            return
        head = json.dumps({"rid": rid, "hs": batch}).encode()
        self._sock.send_multipart([ident, *out.sign([head, *datas])], copy=False)
        self.bytes_sent += sum(len(d) for d in datas)

    def _open_window(self, ident: bytes, out: Any, req: dict) -> None:
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
            if not self._send_placed(win, ident, out, rid, batch, datas):
                self._held[ident] = held[i:]
                return

    def _send_placed(self, win: Window, ident: bytes, out: Any, rid: object, batch: list[str],
                     datas: list[Any]) -> bool:
        """Copy a batch into the peer's window and tell it where; False while the window has no room."""
        placed = win.place(datas)
        if placed is None:
            return False
        seq, at = placed
        head = json.dumps({"rid": rid, "hs": batch, "seq": seq, "at": at}).encode()
        self._sock.send_multipart([ident, *out.sign([head])], copy=False)
        self.bytes_sent += sum(n for _, n in at)
        return True

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
                if self._hint_subs:
                    self._send_hints(time.monotonic(), keepalive=True)
                if self._wake_pull in ready:
                    woke = set()
                    while self._wake_pull.poll(0):
                        woke.update(self._wake_pull.recv().decode().split("\n"))
                    if _HINTS in woke:
                        woke.discard(_HINTS)
                        self._send_hints(time.monotonic())
                    if _RETRY in woke:
                        woke.discard(_RETRY)
                        woke.update(self._parked)
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
                self.downstream = True
                if req.get("op") == "manifest":
                    if self.manifest_json is None:
                        self._parked.setdefault("", []).append((ident, out, None))
                    else:
                        self._sock.send_multipart([ident, *out.sign([self.manifest_json])])
                elif req.get("op") == "get":
                    self._send_available(ident, out, req.get("rid"), [str(h) for h in req.get("hashes", [])])
                elif req.get("op") == "hints":
                    self._hint_subs[ident] = (out, 0, time.monotonic())
                    self._send_hints(time.monotonic())
                elif req.get("op") == "onesided":
                    self._open_window(ident, out, req)
                elif req.get("op") == "ack" and isinstance(req.get("seq"), int):
                    self._ack(ident, req["seq"])
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
                    self._sock.send_multipart([ident, *out.sign([self.manifest_json])])  # type: ignore[attr-defined]  # an Outbound
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


class SourceChunks:
    """Chunks of the controller's tree, read from the files themselves (no copy into a store):
    ``lookup(hash) -> bytes | None`` for a :class:`ChunkServer`.

    ``manifest`` may be set after the server starts (:meth:`ChunkServer.publish`): while the walk
    runs, only the small files it has kept (``held``, filled by :func:`~rlmesh.workspace.manifest.build_manifest`)
    are served. ``extra_roots``: manifest prefix -> the folder its entries come from (editable installs).
    The index of where each chunk lies is made on the first lookup that needs it, on the server's
    thread: a re-sync asks for one chunk, and the index of 10,000 files is then built while the
    receiver parses the manifest, not before the manifest goes out."""

    def __init__(self, root: str, manifest: TreeManifest | None = None, extra_roots: dict[str, str] | None = None):
        self.manifest = manifest
        self.held: dict[str, bytes] = manifest.held if manifest is not None else {}
        self._where: dict[str, tuple[str, int, int]] = {}  # hash -> (tree path, offset, size)
        self._extras = sorted((extra_roots or {}).items(), key=lambda kv: -len(kv[0]))
        self._root = root
        self._base = root.rstrip("/") + "/"

    def _source(self, path: str) -> str:
        for prefix, folder in self._extras:
            if path.startswith(prefix + "/"):
                return os.path.join(folder, *path[len(prefix) + 1:].split("/"))
        return self._base + path if os.sep == "/" else os.path.join(self._root, *path.split("/"))  # tree paths are POSIX

    def _index(self, manifest: TreeManifest) -> None:
        step = manifest.chunk_bytes
        for e in manifest.entries:
            for i, h in enumerate(e.chunks):  # only files have chunks
                self._where.setdefault(h, (e.path, i * step, min(step, e.size - i * step)))

    def __call__(self, h: str) -> bytes | None:
        """A small file's bytes kept by the walk (taken out: each is sent once; one asked for again, by a
        host relinked after its upstream died, is read from its file), else one ``pread`` on a bare
        descriptor: a tree of small files is a lookup per file, and a buffered file object, a seek and
        a join per path were most of the source's serving time."""
        data = self.held.pop(h, None)
        if data is not None:
            return data
        manifest = self.manifest
        if manifest is None:  # still walking: parked until publish() retries it
            return None
        if not self._where:
            self._index(manifest)
        hit = self._where.get(h)
        if hit is None:
            return None
        fd = os.open(self._source(hit[0]), os.O_RDONLY | os.O_CLOEXEC)
        try:
            return pread_full(fd, hit[2], hit[1])
        finally:
            os.close(fd)


def source_lookup(root: str, manifest: TreeManifest | None = None,
                  extra_roots: dict[str, str] | None = None) -> SourceChunks:
    """:class:`SourceChunks` of ``root`` (``manifest``: now, or set on it once the walk is done)."""
    return SourceChunks(root, manifest, extra_roots)


class HotChunks:
    """Chunks that arrived in this receiver's pulls (verified), kept in memory to forward.

    Why: a host forwards every chunk it receives. For a tree of small files, reading each one back
    from the store (open, read, close, and Python around them) was about as much CPU per file as
    storing it; for a big file, a read of each 4 MiB chunk back from the page cache was a copy the
    forward did not need. A chunk received in a frame of its own (``owned``: nobody reuses that
    memory) is kept as it is, whatever its size; one in reused memory (a one-sided read's window) is
    copied, and only up to ``max_chunk`` bytes. Up to ``cap`` bytes in all, the oldest dropped first
    (those are read from the store again): a downstream host asks for a chunk before it arrives here,
    so the forward happens on arrival and only recent chunks matter."""

    def __init__(self, cap: int = 64 << 20, max_chunk: int = 256 << 10) -> None:
        self.cap, self.max_chunk = cap, max_chunk
        self._chunks: dict[str, bytes | memoryview] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def add(self, h: str, data: bytes | memoryview, owned: bool = False) -> None:
        if not (owned or isinstance(data, bytes)):  # a one-sided read's view is reused: copy, small ones only
            if len(data) > self.max_chunk:
                return
            data = bytes(data)
        with self._lock:
            if h in self._chunks:
                return
            self._chunks[h] = data
            self._bytes += len(data)
            while self._bytes > self.cap:
                self._bytes -= len(self._chunks.pop(next(iter(self._chunks))))

    def get(self, h: str) -> bytes | memoryview | None:
        with self._lock:
            return self._chunks.get(h)


def store_lookup(store: ChunkStore, fresh: set[str] | None = None, hot: HotChunks | None = None,
                 coming: set[str] | None = None) -> Callable[[str], bytes | memoryview | None]:
    """Chunks from a host's store, re-hashed before they are forwarded (a chunk edited in place through
    a destination link is never passed on), except those in ``fresh``: hashed on arrival in this sync.
    Those still in ``hot`` (in memory since they arrived) are not read at all. Those in ``coming``
    (asked of upstream, not stored yet) are not looked for: a downstream host asks for the whole tree
    before most of it is here, and two failed ``open`` calls per chunk were ~10 % of a forwarding
    host's time on a tree of small files."""
    fresh = fresh if fresh is not None else set()
    coming = coming if coming is not None else set()

    def lookup(h: str) -> bytes | memoryview | None:
        if hot is not None:
            data = hot.get(h)
            if data is not None:
                return data
        if h in coming:
            return None
        try:
            return store.read(h) if h in fresh else store.read_verified(h)
        except (OSError, CorruptChunkError):
            return None

    return lookup
