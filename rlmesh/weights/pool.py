"""The publisher's slots: which one a new version goes into, which versions are readable, who holds what.

Why a pool: keep-last-N and "never block the trainer, never tear a reader" are one
policy. A new version goes into the oldest slot that is neither among the newest
``keep - 1`` versions nor held (an shm reader's ``flock``, or a lease of a TCP, RDMA
or CUDA IPC reader); if every slot is held, a new slot is made, and spare slots are
freed again once nobody holds them. All methods take the pool's lock: the server
thread opens leases while the trainer thread publishes.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Callable

from rlmesh.weights.layout import Manifest
from rlmesh.weights.slots import EMPTY, READY, WRITING, SlotFile, write_ctl


class SlotPool:
    def __init__(self, base_path: str, ctl_path: str, keep: int, lease_s: float):
        self.base_path, self.ctl_path, self.keep, self.lease_s = base_path, ctl_path, keep, lease_s
        self.lock = threading.RLock()
        self.slots: list[SlotFile] = []
        self.closed = False
        self.on_drop: list[Callable[[SlotFile], None]] = []
        self._next_idx = 0
        self._leases: dict[int, SlotFile] = {}
        self.write_index()

    # ---- what readers see ----
    def advertised(self) -> list[SlotFile]:
        """The newest ``keep`` ready slots, newest first."""
        ready = sorted((s for s in self.slots if s.state == READY), key=lambda s: -s.version)
        return ready[: self.keep]

    def write_index(self) -> None:
        with self.lock:
            doc = {"pid": os.getpid(), "closed": self.closed,
                   "versions": [[s.version, s.path, s.gen] for s in self.advertised()],
                   "slots": [s.path for s in self.slots]}  # every live slot, reserved ones too: readers map them ahead
            write_ctl(self.ctl_path, doc)

    # ---- the writer's side ----
    def _held(self, s: SlotFile, now: float) -> bool:
        for lease in [k for k, exp in s.leases.items() if exp <= now]:
            s.leases.pop(lease)
            self._leases.pop(lease, None)
        return bool(s.leases)

    @staticmethod
    def manifest_room(plan: Manifest) -> int:
        """Bytes a slot needs for ``plan``'s manifest (checksums and transport extras included)."""
        return len(plan.to_bytes()) + 64 * len(plan.entries) + 1024

    def reserve(self, plan: Manifest, n: int) -> int:
        """Create empty slots until ``n`` fit ``plan`` (sparse files, listed in the index so that readers
        map them ahead; their pages come with the first write). Returns how many it created."""
        need_manifest = self.manifest_room(plan)
        made = 0
        while True:
            with self.lock:
                fitting = [s for s in self.slots if s.state == EMPTY and s.data_cap >= plan.total
                           and s.manifest_cap >= need_manifest]
                if self.closed or len(fitting) >= n:
                    return made
                idx, self._next_idx = self._next_idx, self._next_idx + 1
            s = SlotFile(f"{self.base_path}-s{idx}", idx, plan.total, 2 * need_manifest)  # outside the lock
            with self.lock:
                if self.closed:
                    s.close(unlink=True)
                    return made
                self.slots.append(s)
                self.write_index()
            made += 1

    def acquire(self, plan: Manifest) -> SlotFile:
        """An exclusively locked slot big enough for ``plan``, in state WRITING and out of the index."""
        need_manifest = self.manifest_room(plan)
        now = time.monotonic()
        with self.lock:
            protected = {id(s) for s in self.advertised()[: self.keep - 1]}
            for s in sorted(self.slots, key=lambda s: (s.state == READY, s.version, -s.populated)):
                if id(s) in protected or self._held(s, now):
                    continue
                fits = s.data_cap >= plan.total and s.manifest_cap >= need_manifest
                if not s.try_lock():
                    continue  # an shm reader is copying out of it
                if not fits:
                    self.drop(s)  # too small and free: a bigger one replaces it
                    continue
                s.state = WRITING
                s.write_header()
                self.write_index()
                return s
            s = SlotFile(f"{self.base_path}-s{self._next_idx}", self._next_idx, plan.total, 2 * need_manifest)
            self._next_idx += 1
            if not s.try_lock():
                raise RuntimeError(f"cannot lock the fresh slot {s.path}")
            s.state = WRITING
            s.write_header()
            self.slots.append(s)
            return s

    def commit(self, s: SlotFile, version: int, manifest: bytes) -> None:
        """Make ``s`` readable as ``version`` and publish the new index."""
        s.version, s.gen, s.state = int(version), s.gen + 1, READY
        s.manifest = manifest
        s.write_header(manifest)
        s.unlock()
        with self.lock:
            self.trim()
            self.write_index()

    def abort(self, s: SlotFile) -> None:
        s.state = EMPTY
        s.write_header()
        s.unlock()

    def trim(self) -> None:
        """Free spare slots beyond one that nobody holds (made while readers pinned older ones)."""
        now = time.monotonic()
        advertised = {id(s) for s in self.advertised()}
        for s in [s for s in self.slots if id(s) not in advertised][1:]:
            if not self._held(s, now) and s.try_lock():
                self.drop(s)

    def drop(self, s: SlotFile) -> None:
        self.slots.remove(s)
        for fn in self.on_drop:
            fn(s)
        s.close(unlink=True)

    # ---- leases of remote readers (server thread) ----
    def open_lease(self, min_version: int, version: int | None) -> tuple[int, SlotFile] | None:
        with self.lock:
            ready = self.advertised()
            pick = next((s for s in ready if version is not None and s.version == int(version)), None)
            if pick is None and ready and ready[0].version >= min_version:
                pick = ready[0]
            if pick is None:
                return None
            lease = secrets.randbits(62)
            pick.leases[lease] = time.monotonic() + self.lease_s
            self._leases[lease] = pick
            return lease, pick

    def read_views(self, lease: int, ranges: list[tuple[int, int]]) -> list[memoryview]:
        with self.lock:
            s = self._leases.get(lease)
            if s is None or lease not in s.leases:
                raise KeyError("lease expired or unknown; reopen the version")
            s.leases[lease] = time.monotonic() + self.lease_s
        mv = memoryview(s.mm)
        out = []
        for off, n in ranges:
            if off < 0 or n < 0 or off + n > s.data_cap:
                raise ValueError(f"range {off}+{n} outside the version's {s.data_cap} bytes")
            out.append(mv[s.data_off + off : s.data_off + off + n])
        return out

    def close_lease(self, lease: int) -> None:
        with self.lock:
            s = self._leases.pop(lease, None)
            if s is not None:
                s.leases.pop(lease, None)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for s in list(self.slots):
                self.drop(s)
        try:
            os.unlink(self.ctl_path)
        except FileNotFoundError:
            pass
