"""``Subscriber``: pull the version you want, verified, into your tensors.

    sub = rm.weights.Subscriber("policy")
    v = sub.pull_into(model.state_dict(), min_version=k, timeout=30)   # in place
    sd, v = sub.pull(min_version=k, dtype=torch.bfloat16)              # fresh tensors
    sub.latest_version()                                               # no data moved

Transport selection (``transport=None``): CUDA IPC when the publisher is on this
host, serves CUDA IPC and the target is on a GPU; shared memory when it is on this
host; RDMA when the publisher registered a device and pyverbs finds one here; TCP
otherwise. Each fallback that skips a faster transport is logged once, with why.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from rlmesh.actor.context import proc_stopping
from rlmesh.weights import assemble
from rlmesh.weights.base import Fetched, ReaderTransport
from rlmesh.weights.cuda_ipc import CudaIpcReader
from rlmesh.weights.directory import Directory, default_directory, publisher_key, reader_id, this_host
from rlmesh.weights.errors import StateDictMismatchError, TransportUnavailableError, WeightSyncError
from rlmesh.weights.rdma import RdmaReader
from rlmesh.weights.selection import CHOICES, Transport, select_transport
from rlmesh.weights.shard_reader import ShardSetReader
from rlmesh.weights.shm import ShmReader
from rlmesh.weights.slots import quiet_readonly
from rlmesh.weights.stats import SyncStats, Version, record_sync
from rlmesh.weights.tcp import TcpReader

__all__ = ["Subscriber", "select_transport"]

logger = logging.getLogger(__name__)

class Subscriber:
    """Reads versions of ``name`` published by a :class:`Publisher` anywhere in the job.

    Not thread-safe: use one Subscriber per thread. ``timeout`` bounds the wait for the
    publisher's directory record.
    """

    def __init__(self, name: str, transport: str | None = None, *, directory: Directory | None = None,
                 timeout: float = 30.0):
        if transport is not None and transport not in CHOICES:
            raise ValueError(f"transport={transport!r} is not one of {[str(c) for c in CHOICES]} (or None for automatic)")
        self.name, self.forced, self.timeout = name, transport, timeout
        self.directory = directory if directory is not None else default_directory()
        self.reader = reader_id()
        self._record: dict[str, Any] | None = None
        self._seen: tuple | None = None  # identity of the publisher our readers are connected to
        self._readers: dict[str, ReaderTransport] = {}
        self.last_stats: SyncStats | None = None
        self._logged: set[str] = set()

    # ---- discovery ----
    def _lookup(self, timeout: float) -> dict[str, Any]:
        try:
            rec = self.directory.get(publisher_key(self.name), timeout)
        except KeyError:
            raise WeightSyncError(f"no publisher of {self.name!r} appeared within {timeout:.0f}s; "
                                  f"create rm.weights.Publisher({self.name!r}) in the trainer first") from None
        ident = (rec.get("pid"), rec.get("ctl"), rec.get(Transport.TCP), rec.get("set"))
        if ident != self._seen:
            self._drop_readers()  # a new (or restarted) publisher: reconnect
            self._seen = ident
        self._record = rec
        return rec

    def _drop_readers(self) -> None:
        for r in self._readers.values():
            try:
                r.close()
            except Exception:
                logger.debug("closing a %s reader failed", r.name, exc_info=True)
        self._readers.clear()

    def _transport(self, want_cuda: bool, timeout: float) -> ReaderTransport:
        cached = self._record is not None
        rec = self._record or self._lookup(timeout)
        if rec.get("shards"):  # every rank of a trainer mesh publishes its part: read them all at once
            if "sharded" not in self._readers:
                self._readers["sharded"] = ShardSetReader(rec, self.directory, lambda r: self._rank_reader(r, want_cuda),
                                                          self.timeout)
            return self._readers["sharded"]
        if cached and rec.get("host") == this_host() and rec.get("ctl") and not os.path.exists(rec["ctl"]):
            # a same-host publisher whose control file vanished died or was restarted: find its
            # successor, rather than fall back to its (dead) TCP address and wait out a timeout
            self._record = None
            rec = self._lookup(timeout)
        if want_cuda and not rec.get(Transport.CUDA_IPC) and self.forced is None and rec.get("host") == this_host():
            rec = self._lookup(timeout)  # the publisher advertises CUDA IPC once it has published GPU tensors
        try:
            kind, why = select_transport(rec, self.forced, want_cuda, this_host())
        except TransportUnavailableError:
            if not cached:
                raise
            rec = self._lookup(timeout)  # the cached record may be stale (publisher restarted): look again
            kind, why = select_transport(rec, self.forced, want_cuda, this_host())
        if kind not in self._readers:
            self._readers[kind] = self._make(kind, rec)
            if kind not in self._logged:
                self._logged.add(kind)
                logger.info("weights %r: reading over %s (%s)", self.name, kind, why)
        return self._readers[kind]

    def _rank_reader(self, rec: dict[str, Any], want_cuda: bool) -> ReaderTransport:
        """The reader of one rank's publisher of a sharded set, chosen as for any publisher."""
        kind, why = select_transport(rec, self.forced, want_cuda, this_host())
        logger.debug("weights %r: reading %s over %s (%s)", self.name, rec.get("name"), kind, why)
        return self._make(kind, rec)

    @staticmethod
    def _make(kind: str, rec: dict[str, Any]) -> ReaderTransport:
        if kind is Transport.SHM:
            return ShmReader(rec)
        if kind is Transport.TCP:
            return TcpReader(rec)
        if kind is Transport.RDMA:
            return RdmaReader(rec)
        return CudaIpcReader(rec)  # type: ignore[return-value]  # it has ReaderTransport's methods

    # ---- API ----
    def prepare(self, timeout: float = 0.0) -> bool:
        """Connect to the publisher now, so that the first pull only moves bytes: the same-host reader
        maps the publisher's shared-memory slots (those it reserved ahead included). For a reader made
        well before its first pull (a generator's ``__init__``). False, and nothing done, when no
        publisher appears within ``timeout``: the first pull then does it all, as without this."""
        try:
            t = self._transport(False, timeout)
            warm = getattr(t, "warm", None)
            if warm is not None:
                warm()
        except WeightSyncError:
            self._record = None
            return False
        except Exception as exc:  # noqa: BLE001 - an optimisation only: the first pull meets it again and raises
            logger.info("weights %r: prepare skipped (%s: %s); the first pull connects", self.name,
                        type(exc).__name__, exc)
            self._drop_readers()
            self._record = None
            return False
        return True

    def latest_version(self, timeout: float | None = None) -> int | None:
        """Newest readable version, or ``None`` before the first publish. Moves no weight data."""
        t = self._transport(False, self.timeout if timeout is None else timeout)
        try:
            vs = t.versions()
        except WeightSyncError:
            self._record = None
            t = self._transport(False, self.timeout if timeout is None else timeout)
            vs = t.versions()
        return vs[0] if vs else None

    def pull_into(self, target: Any, *, min_version: int = 0, version: int | None = None, timeout: float = 30.0,
                  dtype: Any = None) -> Version:
        """Copy the newest version >= ``min_version`` into ``target`` in place (a state_dict or a module).

        ``version``: ask for that exact version; if it was already dropped (the publisher
        keeps only the newest ``keep``), the newest is delivered and ``.stats.dropped`` is
        set. ``dtype``: check that floating-point targets are in this dtype (the copy
        casts from the published dtype). Raises :class:`StateDictMismatchError` naming the
        first bad key, or :class:`WeightSyncError`; in both cases ``target`` is untouched.
        """
        sd = assemble.as_state_dict(target)
        want_cuda = any(getattr(t, "is_cuda", False) for t in sd.values())
        # A module pulled over TCP takes the verified staging bytes as its own (no copy of the whole
        # model); a state_dict is copied into, since it may alias a module we cannot see.
        owned = assemble.module_tensors(target) if hasattr(target, "named_parameters") else None

        def deliver(f: Fetched) -> None:
            if owned is not None and f.adopt is not None and dtype is None:
                assemble.check_target(f.manifest, sd, dtype)
                if assemble.swap_into(f.manifest, f.sources, owned):
                    f.adopt()
                    return
            assemble.copy_into(f.manifest, f.sources, sd, dtype)

        return self._pull(min_version, version, timeout, want_cuda, deliver)[1]

    def pull(self, *, min_version: int = 0, version: int | None = None, timeout: float = 30.0, dtype: Any = None,
             device: Any = None) -> tuple[dict[str, Any], Version]:
        """Fresh tensors of the newest version >= ``min_version``; ``dtype`` casts floating-point tensors."""
        want_cuda = device is not None and str(device).startswith("cuda")
        return self._pull(min_version, version, timeout, want_cuda,
                          lambda f: assemble.materialize(f.manifest, f.sources, dtype, device))

    def _pull(self, min_version: int, version: int | None, timeout: float, want_cuda: bool, deliver: Any) -> Any:
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        if version is not None:
            min_version = max(min_version, version)  # exact if still kept, else wait for it, else newest
        fetched, transport = self._fetch(min_version, version, deadline, want_cuda)
        try:
            m = fetched.manifest
            t1 = time.perf_counter()
            with quiet_readonly():
                try:
                    assemble.verify(m, fetched.sources, fetched.sums)
                except WeightSyncError:
                    record_sync(SyncStats(self.name, m.version, sum(e.nbytes for e in m.entries),
                                          time.perf_counter() - t0, transport, self.reader), ok=False)
                    raise
                t2 = time.perf_counter()
                out = deliver(fetched)
        finally:
            fetched.release()
        t3 = time.perf_counter()
        dropped = version is not None and m.version != version
        if dropped:
            logger.warning("weights %r: version %d is no longer kept; delivered the newest, %d", self.name, version,
                           m.version)
        stats = SyncStats(self.name, m.version, sum(e.nbytes for e in m.entries), t3 - t0, transport, self.reader,
                          fetched.fetch_seconds, t2 - t1, t3 - t2, version if version is not None else min_version,
                          dropped)
        self.last_stats = stats
        record_sync(stats)
        v = Version(m.version, stats)
        return (out, v) if isinstance(out, dict) else (None, v)

    def _fetch(self, min_version: int, version: int | None, deadline: float, want_cuda: bool) -> tuple[Fetched, str]:
        delay = 0.0005
        last_err: WeightSyncError | None = None
        while True:
            left = deadline - time.monotonic()
            try:
                t = self._transport(want_cuda, max(left, 0.001))
                got = t.fetch(min_version, version, max(left, 0.001))
            except (StateDictMismatchError, TransportUnavailableError):
                raise
            except WeightSyncError as exc:  # past the deadline, the check below says so, with this error
                last_err = exc
                self._record = None  # publisher gone or restarted: look it up again
                got = None
            if got is not None:
                return got, t.name
            if proc_stopping():  # nobody waits for this pull any more; the proc's stop should not wait for it
                raise WeightSyncError(f"no version >= {min_version} of {self.name!r}: this proc is stopping")
            if time.monotonic() >= deadline:
                if last_err is not None:
                    raise WeightSyncError(f"no version >= {min_version} of {self.name!r} within the timeout: "
                                          f"{last_err}") from last_err
                raise WeightSyncError(f"no version >= {min_version} of {self.name!r} within the timeout")
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def close(self) -> None:
        self._drop_readers()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
