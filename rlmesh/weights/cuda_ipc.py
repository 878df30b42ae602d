"""Same-host GPU reader: CUDA IPC handles to the publisher's device copy, no host round trip.

Why: when trainer and generators share a host and both hold CUDA tensors, the
fastest path is device-to-device. The publisher keeps one contiguous CUDA buffer per
slot (same layout as the host slot), exports it once with CUDA IPC, and hands the
handle to readers in each ``open`` reply; a reader maps it (cached per handle),
verifies the checksums on the GPU, and copies device to device into its target.
Slot leases (as for TCP) keep the buffer from being rewritten while it is read.

Needs a CUDA build of torch and a GPU on both sides; tested only where one is lent
(``@pytest.mark.gpu``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from rlmesh.weights.base import Fetched
from rlmesh.weights.errors import WeightSyncError
from rlmesh.weights.layout import Manifest
from rlmesh.weights.selection import Transport
from rlmesh.weights.tcp import Control

logger = logging.getLogger(__name__)


def _encode(handle: tuple) -> list[Any]:
    return [["b", v.hex()] if isinstance(v, (bytes, bytearray)) else ["v", v] for v in handle]


def _decode(rows: list[Any]) -> tuple:
    return tuple(bytes.fromhex(v) if tag == "b" else v for tag, v in rows)


def publish_device_copy(slot: Any, manifest: Manifest, state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Mirror a version into the slot's CUDA buffer if the state_dict lives on a GPU; return manifest extras."""
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    dev = next((v.device for v in state_dict.values() if isinstance(v, torch.Tensor) and v.is_cuda), None)
    if dev is None:
        return {}
    cur = slot.extra.get("cuda")
    if cur is None or cur["buf"].numel() < manifest.total or cur["buf"].device != dev:
        buf = torch.empty(manifest.total, dtype=torch.uint8, device=dev)
        handle = _encode(buf.untyped_storage()._share_cuda_())
        cur = slot.extra["cuda"] = {"buf": buf, "handle": {"ipc": handle, "nbytes": manifest.total}}
    buf = cur["buf"]
    for e in manifest.entries:
        v = state_dict[e.key]
        if e.nbytes == 0:
            continue
        dst = buf[e.offset : e.offset + e.nbytes]
        src = v.detach() if isinstance(v, torch.Tensor) else torch.from_numpy(v)
        dst.view(src.dtype).view(src.shape).copy_(src.to(dev), non_blocking=True)
    torch.cuda.synchronize(dev)  # readers in other processes see the bytes only after this
    return {"cuda_device": dev.index}


class CudaIpcReader(Control):
    name = Transport.CUDA_IPC

    def __init__(self, record: dict[str, Any]):
        super().__init__(record)
        import torch  # deferred: torch is heavy; weights of numpy arrays never load it

        if not torch.cuda.is_available():
            raise WeightSyncError("transport='cuda-ipc' needs CUDA in the reader; torch sees no GPU")
        self._opened: dict[str, Any] = {}

    def _map(self, handle: dict[str, Any]) -> Any:
        import torch  # deferred: torch is heavy; weights of numpy arrays never load it

        key = repr(handle["ipc"])
        t = self._opened.get(key)
        if t is None:
            storage = torch.UntypedStorage._new_shared_cuda(*_decode(handle["ipc"]))
            t = torch.empty((0,), dtype=torch.uint8, device=storage.device)
            t.set_(storage, 0, (int(handle["nbytes"]),), (1,))
            if len(self._opened) >= 8:
                self._opened.pop(next(iter(self._opened)))
            self._opened[key] = t
        return t

    def fetch(self, min_version: int, version: int | None, timeout: float) -> Fetched | None:
        t0 = time.perf_counter()
        opened = self.open(min_version, version, timeout, want=(Transport.CUDA_IPC,))
        if opened is None:
            return None
        lease, manifest, extra = opened
        try:
            if "cuda" not in extra:
                raise WeightSyncError(f"version {manifest.version} of {self.pub_name!r} has no CUDA copy "
                                      f"(publish CUDA tensors to use cuda-ipc)")
            buf = self._map(extra["cuda"])
            sources = [[buf[e.offset : e.offset + e.nbytes]] if e.nbytes else [] for e in manifest.entries]
        except BaseException:
            self.release(lease)
            raise
        return Fetched(manifest, sources, lambda: self.release(lease), time.perf_counter() - t0)

    def close(self) -> None:
        self._opened.clear()
        super().close()
