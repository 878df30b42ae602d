"""Weight-sync planning over RDMA: READs for a version's chunks, and how a slot's region is described.

Why separate: this is everything about weights over RDMA that can be checked without a device
(and is unit-tested here, where pyverbs imports but lists no device); ``rdma.py`` holds only
the verbs calls. The device probe and queue-pair facts are shared with workspace distribution
and live in :mod:`rlmesh.transport.rdma_plan`; they are re-exported here.
"""

from __future__ import annotations

from rlmesh.transport.rdma_plan import (DEPTH, DEVICE_ENV, GID_INDEX_ENV, INSTALL_HINT, PORT_ENV, READ_BYTES, QPInfo,
                                        ReadWR, append_reads, available, region_of)
from rlmesh.weights.errors import WeightSyncError

__all__ = ["DEPTH", "DEVICE_ENV", "GID_INDEX_ENV", "INSTALL_HINT", "PORT_ENV", "READ_BYTES", "QPInfo", "ReadWR",
           "available", "plan_reads", "region_of"]


def plan_reads(chunks: list[tuple[int, int]], remote_addr: int, remote_len: int, max_bytes: int = READ_BYTES) -> list[ReadWR]:
    """Split the manifest's chunks into READs of at most ``max_bytes``, checked against the remote region."""
    out: list[ReadWR] = []
    for off, n in chunks:
        if off < 0 or off + n > remote_len:
            raise WeightSyncError(f"chunk {off}+{n} lies outside the remote region of {remote_len} bytes")
        append_reads(out, off, remote_addr + off, n, max_bytes)
    return out
