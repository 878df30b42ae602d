"""One-sided chunk transfer between hosts of the chain: the pure half (modes, the ring, READ plans).

Why one-sided: over TCP every byte a host forwards costs it a send and its downstream a receive
through both kernels. With RDMA the upstream host copies a batch of chunks once into a window
registered with the NIC, replies with where they lie, and the downstream host READs them with
no work on the upstream's CPU; the control messages (``get``, the placement, ``ack``) still go
over the authenticated channel, and every chunk is verified by its hash after the READ, exactly
as after a TCP receive. The window is a FIFO ring: a batch's space is reused only after the
downstream acknowledged it, so a READ never sees bytes being overwritten.

The verbs and cross-memory-attach calls are in :mod:`rlmesh.workspace.onesided_io`; this module
is what can be checked without a device.
"""

from __future__ import annotations

from collections import deque
from enum import StrEnum

from rlmesh import settings
from rlmesh.transport.rdma_plan import READ_BYTES, ReadWR, append_reads

TRANSPORT_ENV = settings.WORKSPACE_TRANSPORT.name
RING_BYTES = 32 << 20
"""A window per downstream peer: ~32 batches of ~1 MiB awaiting their ``ack``."""


class ChunkTransport(StrEnum):
    """How a host's chunks reach it from its upstream (``RLMESH_WORKSPACE_TRANSPORT``)."""

    AUTO = "auto"
    """RDMA READs where this host and its upstream both have a device, TCP otherwise (per link)."""
    TCP = "tcp"
    """Chunks in the replies of the authenticated channel (CurveZMQ off loopback)."""
    RDMA = "rdma"
    """RDMA READs, or TCP for a link whose upstream has no device (the ``file_syncs`` row says which)."""
    CMA = "cma"
    """The same one-sided protocol with ``process_vm_readv`` for the READ: processes on one machine
    only (refused across machines). It exists so the protocol runs end to end, with real
    processes, where no RDMA device exists; a real multi-host sync never picks it."""


def transport_from_env(default: ChunkTransport = ChunkTransport.AUTO) -> ChunkTransport:
    """``RLMESH_WORKSPACE_TRANSPORT``, checked: a bad value names the key and the choices."""
    if not settings.WORKSPACE_TRANSPORT.is_set():
        return default
    return ChunkTransport(settings.WORKSPACE_TRANSPORT.get())


class FifoRing:
    """Space in a window of ``capacity`` bytes, handed out and given back in order.

    :meth:`place` returns ``(seq, offset)`` for ``n`` contiguous bytes, or ``None`` while the
    batches not yet acknowledged leave no room (the caller holds the batch back until an
    :meth:`ack`). :meth:`ack` of ``seq`` frees that batch and every earlier one: the downstream
    reads batches in the order they were placed.
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"ring capacity must be > 0, got {capacity}")
        self.capacity = capacity
        self._live: deque[tuple[int, int, int]] = deque()  # (seq, offset, n), oldest first
        self._next_seq = 0
        self._head = 0  # where the next batch would start

    @property
    def used(self) -> int:
        if not self._live:
            return 0
        tail = self._live[0][1]
        return self._head - tail if self._head > tail else self.capacity - tail + self._head

    def place(self, n: int) -> tuple[int, int] | None:
        if n <= 0 or n > self.capacity:
            raise ValueError(f"a batch of {n} bytes does not fit a ring of {self.capacity}")
        if not self._live:
            off = 0
        else:
            tail = self._live[0][1]
            if self._head > tail:
                if self._head + n <= self.capacity:
                    off = self._head
                elif n <= tail:  # wrap: the end of the ring is left unused until the tail passes it
                    off = 0
                else:
                    return None
            elif self._head + n <= tail:
                off = self._head
            else:
                return None
        seq = self._next_seq
        self._next_seq += 1
        self._live.append((seq, off, n))
        self._head = off + n
        return seq, off

    def ack(self, seq: int) -> int:
        """Free batch ``seq`` and every earlier one; returns how many were freed (0 for a stale ack)."""
        freed = 0
        while self._live and self._live[0][0] <= seq:
            self._live.popleft()
            freed += 1
        if not self._live:
            self._head = 0
        return freed


def packed_reads(at: list[tuple[int, int]], remote_addr: int, remote_len: int,
                 max_bytes: int = READ_BYTES) -> tuple[list[ReadWR], int]:
    """READs that bring the chunks at ``at`` (``(offset, length)`` in the remote window) into a
    local staging region back to back; returns them and the staging bytes needed.

    A placement outside the window is refused (``ValueError``) before anything is posted: the
    upstream's reply is authenticated, but a wrong offset must not become a READ of other memory.
    """
    wrs: list[ReadWR] = []
    local = 0
    for off, n in at:
        if off < 0 or n < 0 or off + n > remote_len:
            raise ValueError(f"chunk at {off}+{n} lies outside the upstream's window of {remote_len} bytes")
        append_reads(wrs, local, remote_addr + off, n, max_bytes)
        local += n
    return wrs, local
