"""A fast per-tensor checksum: the 64-bit wrap-around sum of the tensor's bytes read as little-endian words.

Why this and not crc32: a reader verifies every byte of every version before it
touches its target, so the checksum is on the critical path of each pull. Summing
uint64 words runs at memory speed (~28 GB/s per core measured here, against ~6.5 GB/s
for ``zlib.crc32``) and is *additive*: the sum of a tensor equals the sum of its
pieces as long as every piece but the last starts at a multiple of 8 bytes, so TCP and
RDMA readers verify chunk by chunk as data arrives. It catches torn reads (bytes from
two versions) and corrupted bytes; it does not detect 8-byte words swapped within one
tensor, which no transport here can cause. Authenticity is the HMAC's job, not this.

CPU buffers are summed with numpy (well-defined unsigned overflow); CUDA tensors with
torch int64 sums, which wrap identically in two's complement, so both give one value.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

MASK = (1 << 64) - 1
# Buffers above this are split across threads (numpy releases the GIL in reductions).
PARALLEL_MIN = 32 << 20
_THREADS = 2
_pool: ThreadPoolExecutor | None = None


def executor() -> ThreadPoolExecutor:
    """Two worker threads shared by checksums and large copies (torch and numpy release the GIL).

    Why our own threads and not OpenMP's: on a loaded host OpenMP workers spin against
    each other and slowed torch copies tenfold here; plain threads just wait.
    """
    return _executor()


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="rlmesh-checksum")
    return _pool


def _sum_words(words: np.ndarray) -> int:
    return int(np.add.reduce(words, dtype=np.uint64)) if words.size else 0


def sum64(buf: Any) -> int:
    """Checksum of a contiguous CPU buffer (bytes, memoryview, numpy array, or CPU torch uint8 tensor)."""
    if hasattr(buf, "numpy") and hasattr(buf, "is_cuda"):
        if buf.is_cuda:
            return sum64_cuda(buf)
        buf = buf.numpy()
    arr = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)
    n = arr.size
    nwords = n // 8
    words = arr[: nwords * 8].view(np.uint64)
    if n >= PARALLEL_MIN:
        half = (nwords // 2 // 8) * 8
        parts = list(_executor().map(_sum_words, (words[:half], words[half:])))
        total = sum(parts)
    else:
        total = _sum_words(words)
    tail = arr[nwords * 8 :]
    if tail.size:
        total += int.from_bytes(tail.tobytes() + b"\0" * (8 - tail.size), "little")
    return total & MASK


def sum64_cuda(t: Any) -> int:
    """Same checksum for a contiguous uint8 CUDA tensor, computed on the device."""
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    flat = t.reshape(-1)
    n = flat.numel()
    nwords = n // 8
    total = 0
    if nwords:
        total = int(flat[: nwords * 8].view(torch.int64).sum().item()) & MASK
    if n % 8:
        tail = bytes(flat[nwords * 8 :].cpu().numpy().tobytes())
        total += int.from_bytes(tail + b"\0" * (8 - len(tail)), "little")
    return total & MASK


def combine(parts: list[int]) -> int:
    """Checksum of a buffer from the checksums of its pieces (see the module docstring for the alignment rule)."""
    return sum(parts) & MASK
