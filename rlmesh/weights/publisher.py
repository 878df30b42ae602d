"""``Publisher``: write each version once into host memory, advertise it, serve it.

    pub = rm.weights.Publisher("policy")
    stats = pub.publish(model.state_dict(), version=step)   # one copy, then returns

Why it returns after one copy: the tensors are copied into a free slot (checksums
summed while the bytes are hot) and the slot is published by an atomic rename of its
index; readers in other procs never wait for it and never see a half-written version
(see :mod:`rlmesh.weights.slots`). The publisher keeps the newest ``keep`` versions
readable; older ones are overwritten unless a reader still holds them, in which case
a new slot is written instead.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
import time
import weakref
from typing import Any, Mapping, Sequence

from rlmesh.transport.auth import SECRET_ENV, Authenticator
from rlmesh.weights import checksum
from rlmesh.weights.directory import Directory, default_directory, publisher_key, this_host, this_job, this_proc_id
from rlmesh.weights.layout import Manifest, plan_layout, with_checksums
from rlmesh.weights.slots import EMPTY, READY, WRITING, SlotFile, base_name, write_ctl
from rlmesh.weights.stats import PublishStats, record_publish

logger = logging.getLogger(__name__)

TRANSPORTS = ("shm", "tcp", "rdma", "cuda-ipc")
CHUNK = 2 << 20  # copy+checksum granularity: stays in cache between the two passes


def _ensure_secret() -> None:
    if not os.environ.get(SECRET_ENV):
        # A plain process (no controller): make one so subprocesses started from here share it.
        os.environ[SECRET_ENV] = Authenticator.new_secret().hex()


def _write_value(dst: Any, value: Any) -> int:
    """Copy one tensor/array into its slot bytes (``dst``: uint8 tensor) and return its checksum."""
    import numpy as np
    import torch

    n = int(dst.numel())
    if n == 0:
        return 0
    if isinstance(value, np.ndarray):
        np.copyto(dst.numpy().view(value.dtype).reshape(value.shape), value)
        return checksum.sum64(dst.numpy())
    src = value.detach()
    if src.is_contiguous() and src.device.type == "cpu" and n > CHUNK:
        raw = src.reshape(-1).view(torch.uint8)

        def piece(off: int) -> int:  # copy, then sum while the bytes are still in cache
            d = dst[off : off + CHUNK]
            d.copy_(raw[off : off + CHUNK])
            return checksum.sum64(d.numpy())

        return checksum.combine(list(checksum.executor().map(piece, range(0, n, CHUNK))))
    dst.view(src.dtype).view(src.shape).copy_(src)  # strided or CUDA source: torch handles it
    return checksum.sum64(dst.numpy())


class Publisher:
    """Versioned weights of one name, published by one proc (normally the trainer).

    ``keep``: versions kept readable (>= 1; default 2, so a reader finishes the version
    it started while the next one is written). ``transports``: which readers to serve;
    shm is always written (it is the host copy every transport reads from). ``host``:
    where the TCP endpoint binds (loopback unless ``RLMESH_BIND_HOST`` says otherwise).
    """

    def __init__(self, name: str, *, keep: int = 2, transports: Sequence[str] = TRANSPORTS,
                 directory: Directory | None = None, host: str | None = None, lease_s: float = 60.0):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (versions kept readable), got {keep}")
        bad = set(transports) - set(TRANSPORTS)
        if bad:
            raise ValueError(f"unknown transport(s) {sorted(bad)}; choose from {list(TRANSPORTS)}")
        self.name, self.keep, self.lease_s = name, keep, lease_s
        self.transports = tuple(transports)
        self.directory = directory if directory is not None else default_directory()
        self.job, self.proc, self.host = this_job(), this_proc_id(), this_host()
        self._base = base_name(self.job, self.proc, os.getpid(), name)
        from rlmesh.weights.slots import SHM_DIR

        self._shm_dir = SHM_DIR
        self.ctl_path = os.path.join(SHM_DIR, self._base + ".ctl")
        self._lock = threading.RLock()
        self._publish_lock = threading.Lock()
        self._slots: list[SlotFile] = []
        self._next_idx = 0
        self._latest = -1
        self._leases: dict[int, SlotFile] = {}
        self._closed = False
        self._rdma: Any = None
        self._cuda: Any = None
        _ensure_secret()
        write_ctl(self.ctl_path, self._ctl_doc())
        self._server = None
        if {"tcp", "rdma", "cuda-ipc"} & set(self.transports):
            from rlmesh.weights.server import SyncServer

            self._server = SyncServer(self, host)
        if "rdma" in self.transports:
            from rlmesh.weights import rdma

            self._rdma = rdma.PublisherSide.maybe_open(name)
        self.directory.put(publisher_key(name), self.record())
        self._register_cleanup()
        logger.info("weights %r: publisher ready (shm %s, tcp %s, rdma %s)", name, self.ctl_path,
                    self._server.addr if self._server else "off", "on" if self._rdma else "off")

    # ---- discovery ----
    def record(self) -> dict[str, Any]:
        """What subscribers read from the directory to reach this publisher."""
        return {
            "name": self.name, "host": self.host, "job": self.job, "proc": self.proc, "pid": os.getpid(),
            "ctl": self.ctl_path, "tcp": self._server.addr if self._server else None,
            "rdma": self._rdma.describe() if self._rdma else None,
            "cuda_ipc": "cuda-ipc" in self.transports, "keep": self.keep,
        }

    def _ctl_doc(self) -> dict[str, Any]:
        ready = self._advertised()
        return {"name": self.name, "pid": os.getpid(), "closed": self._closed,
                "versions": [[s.version, s.path, s.gen] for s in ready]}

    def _advertised(self) -> list[SlotFile]:
        ready = sorted((s for s in self._slots if s.state == READY), key=lambda s: -s.version)
        return ready[: self.keep]

    def versions(self) -> list[int]:
        """Versions readable now, newest first."""
        with self._lock:
            return [s.version for s in self._advertised()]

    def latest_version(self) -> int | None:
        return self._latest if self._latest >= 0 else None

    @staticmethod
    def _manifest_of(slot: SlotFile) -> Manifest:
        return Manifest.from_bytes(slot.manifest)

    # ---- publishing ----
    def publish(self, state_dict: Mapping[str, Any], version: int) -> PublishStats:
        """Write ``state_dict`` as ``version`` (must exceed the last one) and make it visible to readers."""
        if self._closed:
            raise RuntimeError(f"publisher {self.name!r} is closed")
        t0 = time.perf_counter()
        with self._publish_lock:
            if int(version) <= self._latest:
                raise ValueError(f"versions are monotonic: {version} after {self._latest} for {self.name!r}")
            plan = plan_layout(self.name, version, state_dict)
            slot = self._acquire_slot(plan)
            try:
                data = slot.data_view()
                sums = [_write_value(data[e.offset : e.offset + e.nbytes], state_dict[e.key]) for e in plan.entries]
                copied = time.perf_counter()
                manifest = with_checksums(plan, sums, version)
                extra = self._cuda_write(slot, manifest, state_dict)
                if extra:
                    manifest = with_checksums(plan, sums, version, extra)
                slot.version, slot.gen, slot.state = int(version), slot.gen + 1, READY
                slot.manifest = manifest.to_bytes()
                slot.write_header(slot.manifest)
            except BaseException:
                slot.state = EMPTY
                slot.write_header()
                raise
            finally:
                slot.unlock()
            with self._lock:
                self._latest = int(version)
                self._trim()
                write_ctl(self.ctl_path, self._ctl_doc())
        stats = PublishStats(self.name, int(version), plan.total, time.perf_counter() - t0, copied - t0, slot.idx)
        record_publish(stats)
        return stats

    def _acquire_slot(self, plan: Manifest) -> SlotFile:
        """An exclusively locked slot big enough for ``plan``; never one of the newest keep-1 versions."""
        need_manifest = len(plan.to_bytes()) + 64 * len(plan.entries) + 1024
        now = time.monotonic()
        with self._lock:
            protected = set(id(s) for s in self._advertised()[: self.keep - 1])
            order = sorted(self._slots, key=lambda s: (s.state == READY, s.version))
            for s in order:
                if id(s) in protected or any(exp > now for exp in s.leases.values()):
                    continue
                if s.data_cap < plan.total or s.manifest_cap < need_manifest:
                    if s.try_lock():  # too small and free: drop it, a bigger one replaces it
                        self._drop(s)
                    continue
                if s.try_lock():
                    s.state = WRITING
                    s.write_header()
                    write_ctl(self.ctl_path, self._ctl_doc())
                    return s
            path = os.path.join(self._shm_dir, f"{self._base}-s{self._next_idx}")
            s = SlotFile(path, self._next_idx, plan.total, 2 * need_manifest)
            self._next_idx += 1
            if not s.try_lock():
                raise RuntimeError(f"cannot lock fresh slot {path}")
            s.state = WRITING
            s.write_header()
            self._slots.append(s)
            return s

    def _trim(self) -> None:
        """Free slots beyond keep+1 that nobody holds (they were made while readers pinned older ones)."""
        now = time.monotonic()
        advertised = set(id(s) for s in self._advertised())
        spare = [s for s in self._slots if id(s) not in advertised]
        for s in spare[1:]:
            if not any(exp > now for exp in s.leases.values()) and s.try_lock():
                self._drop(s)

    def _drop(self, s: SlotFile) -> None:
        self._slots.remove(s)
        if self._rdma:
            self._rdma.forget(s)
        s.close(unlink=True)

    def _cuda_write(self, slot: SlotFile, manifest: Manifest, state_dict: Mapping[str, Any]) -> dict[str, Any]:
        if "cuda-ipc" not in self.transports:
            return {}
        from rlmesh.weights import cuda_ipc

        return cuda_ipc.publish_device_copy(slot, manifest, state_dict)

    # ---- leases for remote readers (called on the server thread) ----
    def _open_lease(self, min_version: int, version: Any, want: Sequence[str]) -> tuple[int, bytes, dict[str, Any]] | None:
        with self._lock:
            ready = self._advertised()
            pick = next((s for s in ready if version is not None and s.version == int(version)), None)
            if pick is None and ready and ready[0].version >= min_version:
                pick = ready[0]
            if pick is None:
                return None
            lease = secrets.randbits(62)
            pick.leases[lease] = time.monotonic() + self.lease_s
            self._leases[lease] = pick
            extra: dict[str, Any] = {"slot": pick.idx, "gen": pick.gen}
            if "rdma" in want and self._rdma:
                extra["rdma"] = self._rdma.region(pick)
            if "cuda-ipc" in want and "cuda" in pick.extra:
                extra["cuda"] = pick.extra["cuda"]["handle"]
            return lease, pick.manifest, extra

    def _read_views(self, lease: int, ranges: list[tuple[int, int]]) -> list[memoryview]:
        with self._lock:
            slot = self._leases.get(lease)
            if slot is None or lease not in slot.leases:
                raise KeyError("lease expired or unknown; reopen the version")
            slot.leases[lease] = time.monotonic() + self.lease_s
        mv = memoryview(slot.mm)
        out = []
        for off, n in ranges:
            if off < 0 or n < 0 or off + n > slot.data_cap:
                raise ValueError(f"range {off}+{n} outside the version's {slot.data_cap} bytes")
            out.append(mv[slot.data_off + off : slot.data_off + off + n])
        return out

    def _close_lease(self, lease: int) -> None:
        with self._lock:
            slot = self._leases.pop(lease, None)
            if slot is not None:
                slot.leases.pop(lease, None)

    def _rdma_connect(self, qp: dict[str, Any]) -> dict[str, Any]:
        if not self._rdma:
            raise RuntimeError("this publisher has no RDMA device")
        with self._lock:
            return self._rdma.connect(qp, list(self._slots))

    # ---- lifecycle ----
    def close(self) -> None:
        """Stop serving, unlink every segment and withdraw the directory record (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._server:
            self._server.close()
        with self._lock:
            for s in list(self._slots):
                self._drop(s)
        try:
            os.unlink(self.ctl_path)
        except FileNotFoundError:
            pass
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
            from rlmesh.actor.hooks import add_shutdown_hook

            add_shutdown_hook(_cleanup)
        except ImportError:
            pass

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
