"""Which transport a reader uses for a publisher: pure, so it is unit-tested without any of them.

Automatic order: CUDA IPC (same host, GPU target, publisher has a device copy), shared
memory (same host: the publisher's index file is visible here), RDMA (other host, a
device on both sides), TCP. A forced transport that cannot work raises with the fix.
"""

from __future__ import annotations

import os
from typing import Any

from rlmesh.weights import rdma_plan as rdma
from rlmesh.weights.errors import TransportUnavailableError

CHOICES = ("shm", "tcp", "rdma", "cuda-ipc")


def select_transport(record: dict[str, Any], forced: str | None, want_cuda: bool, host: str) -> tuple[str, str]:
    """``(transport, reason)`` for reading from ``record``'s publisher; pure, so it is unit-tested."""
    same_host = record.get("host") == host and os.path.exists(record.get("ctl") or "")
    if forced is not None:
        if forced not in CHOICES:
            raise ValueError(f"transport={forced!r} is not one of {list(CHOICES)} (or None for automatic)")
        if forced in ("shm", "cuda-ipc") and not same_host:
            raise TransportUnavailableError(
                f"transport={forced!r} needs the publisher on this host; it is on {record.get('host')!r} (use 'tcp')")
        if forced == "rdma":
            ok, why = rdma.available()
            if not record.get("rdma") or not ok:
                raise TransportUnavailableError(
                    f"transport='rdma' unavailable: {why if not ok else 'the publisher registered no RDMA device'}; use 'tcp'")
        if forced == "tcp" and not record.get("tcp"):
            raise TransportUnavailableError("transport='tcp' but the publisher was created without 'tcp' in transports")
        return forced, "forced"
    if same_host:
        if want_cuda and record.get("cuda_ipc"):
            return "cuda-ipc", "same host, CUDA target"
        return "shm", "same host"
    if record.get("rdma"):
        ok, why = rdma.available()
        if ok:
            return "rdma", "other host, RDMA device on both sides"
        return "tcp", f"other host; rdma unavailable here: {why}"
    return "tcp", "other host; the publisher has no RDMA device"
