"""Reading a sharded set (:mod:`rlmesh.weights.sharded`): every rank's part of one version, at once.

A :class:`ShardSetReader` is one more reader transport to the ``Subscriber``: it holds a reader
per rank (shm, TCP or RDMA, each chosen for that rank's publisher as for any publisher), and its
``fetch`` returns one version of the whole model whose entries are the whole tensors, each made
of its runs from the ranks in order. The Subscriber then verifies and copies as for one
publisher: the run of every rank is checked against that rank's checksum before any target byte
changes, and the copy puts each run at its place in the target tensor (no gather buffer).

Why the checks: the ranks publish independently, so the newest version one rank holds may not
exist yet on another (it is still writing it, or died doing so), and a rank's record may still
be its dead predecessor's. ``fetch`` takes the newest version that every rank holds, fetches it
from each rank in parallel, and delivers it only if every manifest names that version, the set
of the directory record, its own rank and the same world, keys, dtypes and whole shapes, and the
runs of each tensor tile it; otherwise it lets go of everything and the Subscriber looks again.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from rlmesh.weights import checksum
from rlmesh.weights.base import Fetched, ReaderTransport
from rlmesh.weights.directory import Directory, publisher_key
from rlmesh.weights.errors import WeightSyncError
from rlmesh.weights.layout import Manifest, TensorEntry, align_up, itemsize
from rlmesh.weights.sharded import ShardMeta

logger = logging.getLogger(__name__)


class ShardSetReader:
    """Reads versions of a sharded set from every rank at once (``record``: the set's directory record).

    ``make`` builds the reader of one rank's publisher from its directory record (the Subscriber's
    transport choice); ``lookup_s`` bounds the wait for a rank's record.
    """

    def __init__(self, record: dict[str, Any], directory: Directory,
                 make: Callable[[dict[str, Any]], ReaderTransport], lookup_s: float = 30.0) -> None:
        self.set_id, self.world = str(record["set"]), int(record["world"])
        self.names = [str(n) for n in record["shards"]]
        self.pub_name = str(record["name"])
        if len(self.names) != self.world:
            raise WeightSyncError(f"the set record of {self.pub_name!r} lists {len(self.names)} shards for "
                                  f"world {self.world}; republish it")
        self.directory, self.make, self.lookup_s = directory, make, lookup_s
        self._readers: list[ReaderTransport | None] = [None] * self.world
        self._pool = ThreadPoolExecutor(self.world, thread_name_prefix="rlmesh-shards")
        self.name = "shm"

    # ---- the readers of the ranks ----
    def _reader(self, rank: int, wait: float | None = None) -> ReaderTransport:
        """Rank ``rank``'s reader, its record waited for up to ``wait`` s (default ``lookup_s``)."""
        r = self._readers[rank]
        if r is None:
            wait = self.lookup_s if wait is None else wait
            try:
                rec = self.directory.get(publisher_key(self.names[rank]), wait)
            except KeyError:
                raise WeightSyncError(f"rank {rank} of sharded {self.pub_name!r} published no record within "
                                      f"{wait:g} s; did every rank of the trainer mesh start?") from None
            r = self._readers[rank] = self.make(rec)
            kinds = {x.name for x in self._readers if x is not None}
            self.name = kinds.pop() if len(kinds) == 1 else "mixed"
        return r

    def _drop(self, rank: int) -> None:
        """Forget rank ``rank``'s reader: its record is looked up again (a restarted rank's successor)."""
        r, self._readers[rank] = self._readers[rank], None
        if r is not None:
            try:
                r.close()
            except Exception:  # noqa: BLE001 - closing a reader of a dead publisher may fail; it is dropped anyway
                logger.debug("closing rank %d's reader failed", rank, exc_info=True)

    def _each(self, fn: Callable[[int], Any], undo: Callable[[Any], None] | None = None) -> list[Any]:
        """``fn(rank)`` for every rank, in parallel. If any fails, the results of the others are
        undone (``undo``: a fetched version let go), a rank whose reader failed is dropped (its record
        is looked up again next time), and the first error is raised."""
        futures = [self._pool.submit(fn, r) for r in range(self.world)]
        out, first = [], None
        for rank, fut in enumerate(futures):
            try:
                out.append(fut.result())
            except BaseException as exc:  # noqa: BLE001 - re-raised below, once every rank is accounted for
                if isinstance(exc, WeightSyncError):
                    self._drop(rank)
                first = first or exc
                out.append(None)
        if first is not None:
            if undo is not None:
                for x in out:
                    if x is not None:
                        undo(x)
            raise first
        return out

    # ---- ReaderTransport ----
    def versions(self) -> list[int]:
        """The versions every rank holds, newest first."""
        held = self._each(lambda r: set(self._reader(r).versions()))
        return sorted(set.intersection(*held), reverse=True)

    def warm(self) -> int:
        """Map (shm) or connect every rank's publisher now, so the first pull only moves bytes; raises
        :class:`WeightSyncError` at once, waiting for nothing, while a rank has no record yet (a
        ``Subscriber.prepare`` then leaves it to the first pull)."""
        def one(r: int) -> int:
            w = getattr(self._reader(r, wait=0), "warm", None)
            return int(w()) if w is not None else 0
        return sum(self._each(one))

    def fetch(self, min_version: int, version: int | None, timeout: float) -> Fetched | None:
        t0 = time.perf_counter()
        common = self.versions()
        pick = version if version is not None and version in common else None
        if pick is None and common and common[0] >= min_version:
            pick = common[0]
        if pick is None:
            return None
        got: list[Fetched | None] = self._each(lambda r: self._reader(r).fetch(pick, pick, timeout),
                                               undo=lambda f: f.release())
        try:
            if any(f is None or f.manifest.version != pick for f in got):
                self._let_go(got)  # a rank moved on (or is rewriting) since we asked: look again
                return None
            parts: list[Fetched] = [f for f in got if f is not None]
            metas = [ShardMeta.of(f.manifest) for f in parts]
            for rank, meta in enumerate(metas):
                if meta is None or meta.set_id != self.set_id:
                    # a rank's record is its dead predecessor's, or the set was republished: look it up again
                    logger.info("weights %r: rank %d's version %d belongs to another set; looking again",
                                self.pub_name, rank, pick)
                    self._let_go(got)
                    self._drop(rank)
                    return None
            return self._assemble(pick, parts, [m for m in metas if m is not None], t0)
        except BaseException:
            self._let_go(got)
            raise

    @staticmethod
    def _let_go(got: list[Any]) -> None:
        for f in got:
            if f is not None:
                f.release()

    def _assemble(self, version: int, parts: list[Fetched], metas: list[ShardMeta], t0: float) -> Fetched:
        """One version of the whole model out of every rank's part, once they agree (see the module docstring)."""
        head = metas[0]
        for rank, (f, meta) in enumerate(zip(parts, metas)):
            if meta.rank != rank or meta.world != self.world:
                raise WeightSyncError(f"version {version} of sharded {self.pub_name!r}: rank {rank}'s part says it is "
                                      f"rank {meta.rank} of {meta.world}, the set has {self.world}; refused")
            keys = [e.key for e in f.manifest.entries]
            if keys != [k for k, _, _ in meta.layout] or keys != [k for k, _, _ in head.layout]:
                raise WeightSyncError(f"version {version} of sharded {self.pub_name!r}: rank {rank}'s part lists "
                                      "other tensors than rank 0's; refused (every rank publishes the same keys)")
            for e, (k, shape, _), (_, shape0, _), e0 in zip(f.manifest.entries, meta.layout, head.layout,
                                                            parts[0].manifest.entries):
                if shape != shape0 or e.dtype != e0.dtype or e.kind != e0.kind:
                    raise WeightSyncError(f"version {version} of sharded {self.pub_name!r}: {k!r} is {e.dtype} "
                                          f"{shape} on rank {rank} but {e0.dtype} {shape0} on rank 0; refused")
        entries: list[TensorEntry] = []
        sources: list[list[Any]] = []
        sums: list[int] | None = [] if all(f.sums is not None for f in parts) else None
        offset = 0
        for i, (key, shape, _) in enumerate(head.layout):
            e0 = parts[0].manifest.entries[i]
            size = itemsize(e0.kind, e0.dtype)
            whole = math.prod(shape) * size
            runs = sorted((metas[r].layout[i][2] * size, r) for r in range(self.world)
                          if parts[r].manifest.entries[i].nbytes)
            pos = 0
            pieces: list[Any] = []
            for start, r in runs:
                if start != pos:
                    raise WeightSyncError(f"version {version} of sharded {self.pub_name!r}: the ranks' runs of "
                                          f"{key!r} leave a gap or overlap at byte {pos}; refused")
                pieces += parts[r].sources[i]
                pos += parts[r].manifest.entries[i].nbytes
            if pos != whole:
                raise WeightSyncError(f"version {version} of sharded {self.pub_name!r}: the ranks' runs of {key!r} "
                                      f"hold {pos} bytes of its {whole}; refused")
            ck = checksum.combine([parts[r].manifest.entries[i].checksum for _, r in runs])
            entries.append(TensorEntry(key, e0.kind, e0.dtype, shape, offset, whole, ck))
            sources.append(pieces)
            if sums is not None:
                sums.append(checksum.combine([parts[r].sums[i] for _, r in runs]))  # type: ignore[index]  # all set
            offset = align_up(offset + whole)
        manifest = Manifest(self.pub_name, version, max(offset, 64), tuple(entries), {"shards": self.world})
        return Fetched(manifest, sources, lambda: self._let_go(list(parts)), time.perf_counter() - t0, sums)

    def close(self) -> None:
        for rank in range(self.world):
            self._drop(rank)
        self._pool.shutdown(wait=False)


