"""Which transport a reader uses for a publisher: pure, so it is unit-tested without any of them.

Automatic order: CUDA IPC (same host, GPU target, publisher has a device copy), shared
memory (same host: the publisher's index file is visible here), RDMA (other host, a
device on both sides), TCP. A forced transport that cannot work raises with the fix.
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Any

from rlmesh.weights import rdma_plan as rdma
from rlmesh.weights.errors import TransportUnavailableError


class Transport(StrEnum):
    """The weight transports, one spelling each: ``transport=`` settings, the ``weight_syncs.transport``
    column and the keys of a publisher's directory record (``record[Transport.TCP]`` is its address)."""

    SHM = "shm"
    TCP = "tcp"
    RDMA = "rdma"
    CUDA_IPC = "cuda-ipc"


CHOICES = tuple(Transport)


def select_transport(record: dict[str, Any], forced: str | None, want_cuda: bool, host: str) -> tuple[Transport, str]:
    """``(transport, reason)`` for reading from ``record``'s publisher; pure, so it is unit-tested."""
    same_host = record.get("host") == host and os.path.exists(record.get("ctl") or "")
    if forced is not None:
        if forced not in CHOICES:
            raise ValueError(f"transport={forced!r} is not one of {[str(c) for c in CHOICES]} (or None for automatic)")
        forced = Transport(forced)
        if forced in (Transport.SHM, Transport.CUDA_IPC) and not same_host:
            raise TransportUnavailableError(
                f"transport={forced!r} needs the publisher on this host; it is on {record.get('host')!r} (use 'tcp')")
        if forced is Transport.RDMA:
            ok, why = rdma.available()
            if not record.get(Transport.RDMA) or not ok:
                raise TransportUnavailableError(
                    f"transport='rdma' unavailable: {why if not ok else 'the publisher registered no RDMA device'}; use 'tcp'")
        if forced is Transport.TCP and not record.get(Transport.TCP):
            raise TransportUnavailableError("transport='tcp' but the publisher was created without 'tcp' in transports")
        return forced, "forced"
    if same_host:
        if want_cuda and record.get(Transport.CUDA_IPC):
            return Transport.CUDA_IPC, "same host, CUDA target"
        return Transport.SHM, "same host"
    if record.get(Transport.RDMA):
        ok, why = rdma.available()
        if ok:
            return Transport.RDMA, "other host, RDMA device on both sides"
        return Transport.TCP, f"other host; rdma unavailable here: {why}"
    return Transport.TCP, "other host; the publisher has no RDMA device"
