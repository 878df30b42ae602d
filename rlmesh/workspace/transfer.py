"""Chunks along a pipelined chain: source -> host0 -> host1 -> ..., a :class:`Receiver` per host.

Why a chain: each host forwards a chunk to the next as soon as it has stored (and
verified) it, so the source sends every byte once and the time to N hosts is about
the time to one plus N hops of one chunk. A :class:`Receiver` asks its upstream's
:class:`~rlmesh.workspace.serve.ChunkServer` only for the chunks its store lacks, verifies
each before storing it, serves them downstream from its own server, and then materialises
the tree.

Between hosts with RDMA devices the chunks themselves skip the channel: a receiver opens a
window on its upstream (``onesided`` request), and each reply then says where in that window
its batch lies; the receiver READs it, verifies and stores it as before, and acknowledges it
(:mod:`rlmesh.workspace.onesided`). A link where that is refused stays on TCP.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from rlmesh.transport import Authenticator, AuthError, connect_channel, zmq_context
from rlmesh.transport.sockets import tune
from rlmesh.workspace.manifest import Kind, TreeManifest, gc_paused
from rlmesh.workspace.onesided import ChunkTransport, transport_from_env
from rlmesh.workspace.onesided_io import OneSidedError, Puller, new_puller
from rlmesh.workspace.serve import ChunkServer, HotChunks, store_lookup
from rlmesh.workspace.store import ArrivalLinks, ChunkStore, materialise, placement, read_state, solo_modes

logger = logging.getLogger(__name__)

GROUP_BYTES = 16 << 20  # one get request asks for about this much
WINDOW = 3  # get requests in flight: the pipe never drains, memory per hop stays ~ WINDOW * GROUP_BYTES


class WorkspaceSyncError(RuntimeError):
    """A sync could not complete (upstream silent, corrupt data); chunks already stored are kept."""


@dataclass
class WorkspaceSyncStats:
    """What one receiver did in one sync (a ``file_syncs`` row)."""

    files: int = 0
    files_written: int = 0
    files_skipped: int = 0
    bytes_total: int = 0
    bytes_received: int = 0
    chunks_received: int = 0
    chunks_deduplicated: int = 0
    duration_s: float = 0.0
    cpu_s: float = 0.0  # CPU seconds of this host's process during the pull (serving downstream included)
    transport: str = "tcp"
    relinks: int = 0  # times the upstream was replaced (its host died, or its pull failed, during the sync)
    error: str = ""


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
        self._coming: set[str] = set()  # asked of upstream, not stored yet: a downstream get for one is parked
        self._hot = HotChunks()
        self.server = ChunkServer(None, store_lookup(store, self._fresh, self._hot, self._coming), self._auth, host)
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

    def pull(self, upstream: str, timeout: float = 60.0) -> WorkspaceSyncStats:
        """Fetch what the store lacks from ``upstream``, then materialise into ``dest``.

        ``timeout`` bounds the wait for *progress* (any reply), not the whole sync.
        """
        t0, c0 = time.perf_counter(), time.process_time()
        st = WorkspaceSyncStats()
        link = _Link(self._auth, upstream)
        puller: Puller | None = None
        try:
            link.ask({"op": "manifest"})
            link.ask({"op": "hints"})  # small files' chunks while the source walks (none from another host)
            previous = read_state(self.dest)  # read while the manifest travels: rows accepted last time are not re-checked
            pending: set[str] = set()
            verified: set[str] = set()
            hinted: dict[str, int] = {}  # chunk -> the mode it is stored with (its file's), fetched before the manifest
            links = ArrivalLinks(self.store, self.dest) if not previous else None
            self._listed: dict[str, set[str]] = {}  # the store's folders, listed once for the hints' small batches

            def ask_manifest_again() -> None:  # a new upstream: the manifest, and the hinted chunks not here yet
                link.ask({"op": "manifest"})
                self._ask(link, sorted(pending), {})

            while True:
                reply = self._next(link, st, timeout, ask_manifest_again)
                first = reply[0]
                if first is None:
                    continue
                if first.startswith(b'{"hints"'):
                    self._prefetch(link, json.loads(first)["hints"], hinted, pending)
                elif first.startswith(b'{"rid"'):
                    self._keep(json.loads(first)["hs"], reply[1:], pending, verified, hinted, st, links)
                else:
                    mjson = first
                    break
            if mjson.startswith(b'{"error"'):
                raise WorkspaceSyncError(f"upstream has no manifest to send: {json.loads(mjson).get('error')}")
            manifest = TreeManifest.from_json(mjson, previous)  # refuses escaping paths before anything is written
            self.server.manifest_json = mjson  # downstream parses it while this host plans (a get before
            self.server.arrived()  # ``_coming`` is set finds nothing on disk and is parked all the same)
            sizes = manifest.chunk_sizes()
            missing = [h for h in self.store.missing(list(sizes)) if h not in pending]  # those are on their way
            self._coming.update(missing)  # asked for from here on: parked, not looked for on disk
            self._coming.update(pending)
            st.chunks_deduplicated = len(sizes) - len(missing) - sum(1 for h in sizes if h in pending or h in verified)
            groups = _groups(missing, sizes)
            where = placement(manifest, missing)  # chunks of multi-chunk files: written into their file object
            modes = solo_modes(manifest, where, set(missing))  # chunks of one-chunk files: stored with the file's mode
            modes.update(hinted)
            if links is not None:
                links.plan(manifest, modes)
                if not links.active:
                    links = None
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
                if "hints" in head:  # the source's last word on them, after its manifest: all asked for already
                    continue
                if "onesided" in head:
                    puller = self._attach(puller, head, st, link)
                    continue
                hashes = head["hs"]  # every reply is a batch, parked chunks' too
                datas: list[Any] = reply[1:]
                if "at" in head:  # the batch lies in our window upstream: READ it, then let the room go
                    if puller is None:  # placed before our refusal of the window reached upstream: ask again
                        link.ask({"op": "get", "rid": -1, "hashes": [h for h in hashes if h in pending]})
                        continue
                    try:
                        datas = puller.read([(int(o), int(n)) for o, n in head["at"]])
                    except (OneSidedError, ValueError) as exc:
                        raise WorkspaceSyncError(f"one-sided read from upstream failed: {exc}") from exc
                    link.ask({"op": "ack", "seq": head["seq"]})
                self._keep(hashes, datas, pending, verified, modes, st, links, where, owned="at" not in head)
            with gc_paused():  # 10,000 entries: rows compared, listings made, no collection over them
                res = materialise(manifest, self.store, self.dest, verified, modes, previous, mjson,
                                  set(links.placed) if links is not None else frozenset())
            st.files = sum(1 for e in manifest.entries if e.kind == Kind.FILE)
            st.files_written, st.files_skipped = res.files_written, res.files_unchanged
            st.bytes_total = manifest.total_bytes
        except Exception as exc:
            st.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._coming.clear()  # a failed pull: what never came is looked for on disk again (a later pull)
            if puller is not None:
                try:
                    link.ask({"op": "onesided_close"})
                except zmq.ZMQError:
                    pass  # the upstream is gone: its window went with it
                puller.close()
            st.duration_s = time.perf_counter() - t0
            st.cpu_s = time.process_time() - c0
            link.close()
            self.last = st
        return st

    def _ask(self, link: "_Link", hashes: list[str], sizes: dict[str, int]) -> None:
        """Get requests for ``hashes`` (``sizes`` known: in ~``GROUP_BYTES`` groups; else all in one)."""
        for group in (_groups(hashes, sizes) if sizes else [hashes] if hashes else []):
            link.ask({"op": "get", "rid": -1, "hashes": group})

    def _prefetch(self, link: "_Link", items: list[Any], hinted: dict[str, int], pending: set[str]) -> None:
        """Ask at once for the hinted chunks (``[hash, size, mode]``: small files the source has walked)
        this store lacks; each is stored with its file's mode, so the file can take its inode."""
        fresh: dict[str, tuple[int, int]] = {}
        for h, size, mode in items:
            if isinstance(h, str) and h not in hinted and h not in pending and h not in fresh:
                fresh[h] = (int(size), int(mode) & 0o7777)
        want = self.store.missing(list(fresh), self._listed) if fresh else []
        for h in want:
            hinted[h] = fresh[h][1]
        pending.update(want)
        self._ask(link, want, {h: fresh[h][0] for h in want})

    def _keep(self, hashes: list[str], datas: list[Any], pending: set[str], verified: set[str],
              modes: dict[str, int], st: WorkspaceSyncStats, links: ArrivalLinks | None,
              where: dict[str, tuple[str, int, int]] | None = None, owned: bool = True) -> None:
        """Store a batch of chunks, each verified (a corrupt one raises ``CorruptChunkError``): a chunk
        of a multi-chunk file at its place in the file object (``where``), any other with its file's mode
        (``modes``), linked into a new destination at once (``links``). Before the manifest, the batch is
        hinted small files (``where`` empty, ``modes`` the hints' own). ``owned``: the frames are ours
        (a one-sided window's are reused)."""
        if len(hashes) != len(datas):
            raise WorkspaceSyncError(f"upstream sent {len(datas)} chunk(s) for {len(hashes)} hash(es)")
        stored = []
        keep = self.server.downstream  # nobody downstream (the chain's last host): no chunk kept to forward
        where = where or {}
        for h, data in zip(hashes, datas):
            if h not in pending:
                continue
            if h in where:
                self.store.put_in_object(h, data, *where[h])
            else:
                self.store.put(h, data, modes.get(h, 0o444))
                if links is not None:
                    links.arrived(h)
            self._fresh.add(h)
            if keep:
                self._hot.add(h, data, owned=owned)
            self._coming.discard(h)
            stored.append(h)
            pending.discard(h)
            verified.add(h)
            st.bytes_received += len(data)
        st.chunks_received += len(stored)
        if stored and self.server.downstream:  # downstream requests parked for these go out now
            # (none can be: a request the server takes after this check finds each stored, not coming;
            # the last host skips a wake of its server thread, and its wait for the GIL, per batch)
            self.server.arrived(*stored)

    @staticmethod
    def _attach(puller: Puller | None, head: dict, st: WorkspaceSyncStats, link: "_Link") -> Puller | None:
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

    def _next(self, link: "_Link", st: WorkspaceSyncStats, timeout: float,
              ask_again: Callable[[], None]) -> list[Any]:
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
        n += sizes.get(h, 0)  # a hinted chunk the manifest does not name: asked for all the same
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
        self.sock.send_multipart(self.out.sign([json.dumps(req).encode()]))  # type: ignore[union-attr]  # connected in __init__ until close

    def recv(self, wait_s: float) -> list[Any] | None:
        """One authenticated reply's frames, or None when none came within ``wait_s``: the first (the JSON
        head, or the manifest) as bytes, the chunks as views of the received frames. Why views: a copy
        of every chunk was ~10 % of a receiver's CPU on a big file; a frame is never reused, so a view
        of it may be stored, hashed, written and kept to forward (:class:`HotChunks`) as it is."""
        if not self.sock.poll(int(wait_s * 1000)):  # type: ignore[union-attr]  # connected in __init__ until close
            return None
        frames = self.sock.recv_multipart(copy=False)  # type: ignore[union-attr]  # connected in __init__ until close
        try:
            _, body = self.replies.verify(frames)
        except AuthError:
            return None
        return [body[0].bytes, *(f.buffer for f in body[1:])] if body else []

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None
