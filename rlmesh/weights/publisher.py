"""``Publisher``: write each version once into host memory, advertise it, serve it.

    pub = rm.weights.Publisher("policy")
    stats = pub.publish(model.state_dict(), version=step)   # one copy, then returns

Why it returns after one copy: the tensors are copied into a free slot (checksums
summed while the bytes are hot, on two threads) and the slot is published by an
atomic rename of its index; readers in other procs never wait for it and never see a
half-written version (see :mod:`rlmesh.weights.pool` and :mod:`rlmesh.weights.slots`).
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from rlmesh import settings
from rlmesh.actor.hooks import add_shutdown_hook
from rlmesh.transport.auth import Authenticator
from rlmesh.weights import checksum
from rlmesh.weights import rdma
from rlmesh.weights import cuda_ipc
from rlmesh.weights.directory import Directory, default_directory, publisher_key, this_host, this_job, this_proc_id
from rlmesh.weights.layout import Manifest, plan_layout, with_checksums
from rlmesh.weights.pool import SlotPool
from rlmesh.weights.selection import Transport
from rlmesh.weights.server import SyncServer
from rlmesh.weights.slots import SlotFile, base_name, default_shm_dir
from rlmesh.weights.stats import PublishStats, record_publish

logger = logging.getLogger(__name__)

TRANSPORTS = tuple(Transport)
CHUNK = 2 << 20  # copy+checksum granularity: the bytes are still in cache for the sum


def _ensure_secret() -> None:
    # A plain process (no controller): make one so subprocesses started from here share it.
    settings.SECRET.setdefault(Authenticator.new_secret().hex())


@dataclass(frozen=True)
class _FreshBytes:
    """Where one tensor goes in a slot no version was written to yet (see :meth:`SlotFile.write_fresh`)."""

    slot: SlotFile
    offset: int


def _write_value(dst: Any, value: Any) -> int:
    """Copy one tensor/array into its slot bytes (``dst``: uint8 tensor, or :class:`_FreshBytes`) and
    return its checksum."""
    if isinstance(dst, _FreshBytes):
        return _write_fresh(dst.slot, dst.offset, value)
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    n = int(dst.numel())
    if n == 0:
        return 0
    if isinstance(value, np.ndarray):
        np.copyto(dst.numpy().view(value.dtype).reshape(value.shape), value)
        return checksum.sum64(dst.numpy())
    src = value.detach()
    if src.is_contiguous() and src.device.type == "cpu" and n > CHUNK:
        raw = src.reshape(-1).view(torch.uint8)

        def piece(off: int) -> int:
            d = dst[off : off + CHUNK]
            d.copy_(raw[off : off + CHUNK])
            return checksum.sum64(d.numpy())

        return checksum.combine(list(checksum.executor().map(piece, range(0, n, CHUNK))))
    dst.view(src.dtype).view(src.shape).copy_(src)  # strided or CUDA source: torch handles it
    return checksum.sum64(dst.numpy())


def _write_fresh(slot: SlotFile, offset: int, value: Any) -> int:
    """:func:`_write_value` into a slot no version was written to yet, with ``pwrite`` (see
    :meth:`SlotFile.write_fresh`), straight from the source's bytes; returns the checksum."""
    if isinstance(value, np.ndarray):
        raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    else:
        import torch  # deferred: torch is heavy; weights of numpy arrays never load it

        src = value.detach()
        if src.device.type != "cpu":
            src = src.cpu()
        raw = src.contiguous().reshape(-1).view(torch.uint8).numpy()
    n = int(raw.size)
    if n == 0:
        return 0
    if n <= CHUNK:
        slot.write_fresh(offset, raw)
        return checksum.sum64(raw)

    def piece(off: int) -> int:
        part = raw[off : off + CHUNK]
        slot.write_fresh(offset + off, part)
        return checksum.sum64(part)

    return checksum.combine(list(checksum.executor().map(piece, range(0, n, CHUNK))))


class Publisher:
    """Versioned weights of one name, published by one proc (normally the trainer).

    ``keep``: versions kept readable (>= 1; default 2, so a reader finishes the version
    it started while the next one is written). ``transports``: which readers to serve;
    the shm slots are always written (every transport reads from them). ``host``: where
    the TCP endpoint binds (loopback unless ``RLMESH_BIND_HOST`` says otherwise).
    ``lease_s``: how long a remote reader that stopped answering keeps a slot pinned.
    One publisher per name per job: a second one replaces the first's directory record.
    """

    def __init__(self, name: str, *, keep: int = 2, transports: Sequence[str] = TRANSPORTS,
                 directory: Directory | None = None, host: str | None = None, lease_s: float = 60.0):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (versions kept readable), got {keep}")
        bad = set(transports) - set(TRANSPORTS)
        if bad:
            raise ValueError(f"unknown transport(s) {sorted(bad)}; choose from {[str(t) for t in TRANSPORTS]}")
        self.name, self.keep = name, keep
        self.transports = tuple(transports)
        self.directory = directory if directory is not None else default_directory()
        self.job, self.proc, self.host = this_job(), this_proc_id(), this_host()
        # A token per instance: a Publisher re-created in the same process must never reuse a path
        # that readers still have mapped (they would keep reading the unlinked file).
        base = os.path.join(default_shm_dir(),
                            f"{base_name(self.job, self.proc, os.getpid(), name)}-{secrets.token_hex(4)}")
        self.ctl_path = base + ".ctl"
        self.pool = SlotPool(base, self.ctl_path, keep, lease_s)
        self._latest = -1
        self._publish_lock = threading.Lock()  # one publish at a time: versions stay monotonic
        self._closed = False
        self._cuda_live = False
        self._reserving: threading.Thread | None = None
        self._reserved_bytes = 0
        self._reserve_stop = threading.Event()
        self._rdma: Any = None
        self._server: Any = None
        _ensure_secret()
        if {Transport.TCP, Transport.RDMA, Transport.CUDA_IPC} & set(self.transports):
            self._server = SyncServer(self, host)
        if Transport.RDMA in self.transports:
            self._rdma = rdma.PublisherSide.maybe_open(name)
            if self._rdma:
                self.pool.on_drop.append(self._rdma.forget)
        self.directory.put(publisher_key(name), self.record())
        self._register_cleanup()
        logger.info("weights %r: publisher ready (shm %s, tcp %s, rdma %s)", name, self.ctl_path,
                    self._server.addr if self._server else "off", "on" if self._rdma else "off")

    def record(self) -> dict[str, Any]:
        """What subscribers read from the directory to reach this publisher."""
        return {
            "name": self.name, "host": self.host, "job": self.job, "proc": self.proc, "pid": os.getpid(),
            "ctl": self.ctl_path, Transport.TCP.value: self._server.addr if self._server else None,
            Transport.RDMA.value: self._rdma.describe() if self._rdma else None,
            Transport.CUDA_IPC.value: self._cuda_live, "keep": self.keep,
            "reserved": self._reserved_bytes,  # a network reader's prepare() readies a staging buffer this big
        }

    def versions(self) -> list[int]:
        """Versions readable now, newest first."""
        with self.pool.lock:
            return [s.version for s in self.pool.advertised()]

    def latest_version(self) -> int | None:
        return self._latest if self._latest >= 0 else None

    def reserve(self, state_dict: Mapping[str, Any], *, wait: bool = False, meta: dict[str, Any] | None = None) -> None:
        """Create the shared-memory slots versions of ``state_dict``'s layout will be written to, and
        allocate their pages, on a background thread, so that readers can map the slots ahead
        (``Subscriber.prepare``) and the first publish costs about what a later one does.

        The first two versions each need a slot (``keep`` >= 2 keeps the newest readable while the
        next is written). The slots are made in milliseconds; then the first version's slot has its
        pages populated (``SlotFile.populate``: 0.5 s of a core per GiB on a 2-core VM, the first
        write's extra cost otherwise). Only that one: the second slot's pages come with version 2's
        ``pwrite``, so that populating ahead never takes more CPU from the first training step than
        it saves the first version. When: right after the model is built, so that this overlaps the
        first training step. :meth:`publish` stops the population wherever it has
        got to (waiting for at most one 32 MiB step) and writes the pages not yet populated with
        ``pwrite``, which allocates them without a zero-fill: called back to back, reserve and the
        first publish cost what the publish alone would. ``wait``: return once the slots exist
        (their pages still populating). A ``/dev/shm`` without room for the slots fails here
        (logged) and at ``publish`` (raised), with the fix; ``meta``: what :meth:`publish` will put
        into each manifest (the slots leave room for it).
        """
        plan = replace(plan_layout(self.name, 0, state_dict), extra=dict(meta or {}))
        n = min(self.keep, 2)  # what the pool keeps in steady state: the newest, and one spare (keep >= 2)
        made_them = threading.Event()
        stop = threading.Event()

        def run() -> None:
            t0 = time.perf_counter()
            try:
                made = self.pool.reserve(plan, n)
                if plan.total > self._reserved_bytes and not self._closed:
                    self._reserved_bytes = plan.total
                    self.directory.put(publisher_key(self.name), self.record())
            except Exception:  # noqa: BLE001 - publish() allocates (and reports) itself
                logger.warning("weights %r: reserving slots ahead failed", self.name, exc_info=True)
                return
            finally:
                made_them.set()
            t1 = time.perf_counter()
            try:
                with self.pool.lock:  # the slot the first publish takes (acquire prefers the most populated)
                    first = next((s for s in self.pool.slots if s.fresh and s.data_cap >= plan.total), None)
                done = first is None or first.populate(stop)
            except Exception:  # noqa: BLE001 - publish() writes them itself (and reports a full /dev/shm)
                logger.warning("weights %r: populating reserved slots failed", self.name, exc_info=True)
                return
            logger.info("weights %r: reserved %d slot(s) of %d bytes in %.2fs, pages %s in %.2fs", self.name,
                        made, plan.total, t1 - t0, "populated" if done else "partly populated",
                        time.perf_counter() - t1)

        self._stop_reserving()
        self._reserving = threading.Thread(target=run, name=f"rlmesh-weights-reserve-{self.name}", daemon=True)
        self._reserve_stop = stop
        self._reserving.start()
        if wait:
            made_them.wait()

    def _stop_reserving(self) -> None:
        """Stop a reserve thread's page population where it is and wait for it (at most one step)."""
        if self._reserving is not None:
            self._reserve_stop.set()
            self._reserving.join()
            self._reserving = None

    def publish(self, state_dict: Mapping[str, Any], version: int, *,
                meta: dict[str, Any] | None = None) -> PublishStats:
        """Write ``state_dict`` as ``version`` (must exceed the last one) and make it visible to readers.

        ``meta``: JSON-able keys added to the version's manifest ``extra``, which readers decode
        before they trust any byte (a rank's shard says there which part of the model it holds:
        :mod:`rlmesh.weights.sharded`)."""
        if self._closed:
            raise RuntimeError(f"publisher {self.name!r} is closed")
        with self._publish_lock:
            return self._publish(state_dict, int(version), dict(meta or {}))

    def _publish(self, state_dict: Mapping[str, Any], version: int, meta: dict[str, Any]) -> PublishStats:
        t0 = time.perf_counter()
        if version <= self._latest:
            raise ValueError(f"versions are monotonic: {version} after {self._latest} for {self.name!r}")
        plan = replace(plan_layout(self.name, version, state_dict), extra=meta)  # the slot leaves room for it
        self._stop_reserving()  # slots reserved ahead: use them (as far as populated) rather than make more
        slot = self.pool.acquire(plan)
        try:
            data = slot.data_view()
            # Pages populated ahead are written through the mapping; the rest of a fresh slot with
            # pwrite, which brings its pages without a zero-fill or a fault (see SlotFile.write_fresh).
            dsts: list[Any] = [data[e.offset : e.offset + e.nbytes]
                               if not slot.fresh or e.offset + e.nbytes <= slot.populated
                               else _FreshBytes(slot, e.offset) for e in plan.entries]
            del data
            sums = [_write_value(dst, state_dict[e.key]) for dst, e in zip(dsts, plan.entries)]
            slot.written()
            copied = time.perf_counter()
            extra = self._cuda_write(slot, plan, state_dict)
            manifest = with_checksums(plan, sums, version, {**meta, **extra})
        except BaseException:
            self.pool.abort(slot)
            raise
        self._latest = int(version)
        self.pool.commit(slot, version, manifest.to_bytes())
        if extra and not self._cuda_live:
            self._cuda_live = True
            self.directory.put(publisher_key(self.name), self.record())  # now worth choosing cuda-ipc
        stats = PublishStats(self.name, int(version), plan.total, time.perf_counter() - t0, copied - t0, slot.idx)
        record_publish(stats)
        return stats

    def _cuda_write(self, slot: SlotFile, plan: Manifest, state_dict: Mapping[str, Any]) -> dict[str, Any]:
        if Transport.CUDA_IPC not in self.transports:
            return {}
        return cuda_ipc.publish_device_copy(slot, plan, state_dict)

    @staticmethod
    def _manifest_of(slot: SlotFile) -> Manifest:
        return Manifest.from_bytes(slot.manifest)

    # ---- called by the server thread ----
    def _open_lease(self, min_version: int, version: Any, want: Sequence[str]) -> tuple[int, bytes, dict[str, Any]] | None:
        got = self.pool.open_lease(min_version, None if version is None else int(version))
        if got is None:
            return None
        lease, slot = got
        extra: dict[str, Any] = {"slot": slot.idx, "gen": slot.gen}
        if Transport.RDMA in want and self._rdma:
            extra["rdma"] = self._rdma.region(slot)
        if Transport.CUDA_IPC in want and "cuda" in slot.extra:
            extra["cuda"] = slot.extra["cuda"]["handle"]
        return lease, slot.manifest, extra

    def _read_views(self, lease: int, ranges: list[tuple[int, int]]) -> list[memoryview]:
        return self.pool.read_views(lease, ranges)

    def _close_lease(self, lease: int) -> None:
        self.pool.close_lease(lease)

    def _rdma_connect(self, qp: dict[str, Any]) -> dict[str, Any]:
        if not self._rdma:
            raise RuntimeError("this publisher has no RDMA device")
        with self.pool.lock:
            return self._rdma.connect(qp, list(self.pool.slots))

    # ---- lifecycle ----
    def close(self) -> None:
        """Stop serving, unlink every segment and withdraw the directory record (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop_reserving()
        if self._server:
            self._server.close()
        self.pool.close()
        try:
            rec = self.directory.get(publisher_key(self.name), 0)
            if rec and rec.get("pid") == os.getpid() and rec.get("ctl") == self.ctl_path:
                self.directory.delete(publisher_key(self.name))
        except Exception:
            logger.debug("weights %r: could not withdraw the directory record", self.name, exc_info=True)
        if self._rdma:
            self._rdma.close()

    def _register_cleanup(self) -> None:
        ref = weakref.ref(self)

        def _cleanup() -> None:
            pub = ref()
            if pub is not None:
                pub.close()

        atexit.register(_cleanup)
        try:
            add_shutdown_hook(_cleanup)
        except ImportError:
            pass

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
