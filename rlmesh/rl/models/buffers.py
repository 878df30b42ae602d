"""CPU buffers for KV caches, handed out again once nothing holds them.

Why: every generation call makes a KV cache (``[B, H, max_len, head_dim]`` per layer, keys and
values: ~25 MB at B = 64, d_model 256, 4 layers), and on CPU a fresh allocation of that size
is fresh pages from the kernel: the first write to each page faults. Measured on the 2-core
dev machine, filling 26 columns of eight such tensors took 35 ms freshly allocated and 1 ms in
tensors written before; a multi-turn episode makes one cache per turn, so the faults cost more
than the copy that seeds the cache from the last turn. (CUDA's caching allocator already reuses
blocks; this is for CPU only.)

When a buffer is free: the pool keeps one tensor per buffer and hands out an alias of it (another
tensor on the same storage), so every tensor that can read or write the memory, the alias
itself, any view of it or anything built on its storage, counts on the storage. The buffer is
free when that count is back to the pool's own. Only the storage's count is read, never Python
reference counts: a tracer or debugger that keeps frames' locals alive would inflate those and
stop all reuse. Without the storage count (a torch that lacks it) buffers are not reused at
all: allocations are fresh, as before.
"""

from __future__ import annotations

import threading

import torch

_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)  # private in torch; absent: no reuse
# What the pool's own tensor reads as when nothing else shares its storage (the tensor's use, and
# the storage object asked).
# The tensor is held while it is asked: a temporary would be freed first, and its count read from
# freed memory.
_probe = torch.empty(1)
_OWN_USES = _storage_use_count(_probe.untyped_storage()._cdata) if _storage_use_count else 0
del _probe


class BufferPool:
    """Recycles CPU tensors of the same shape and dtype; keeps at most ``max_free_bytes`` unused.

    ``_tensors`` are the pool's own tensors, never handed out: callers get aliases of them.
    """

    def __init__(self, max_free_bytes: int = 256 << 20) -> None:
        self.max_free_bytes = max_free_bytes
        self._tensors: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self.reused = 0
        self.allocated = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        """An uninitialised tensor, like ``torch.empty``: a free pooled one when its shape and dtype fit."""
        if torch.device(device).type != "cpu" or _storage_use_count is None:
            return torch.empty(shape, dtype=dtype, device=device)
        shape = tuple(shape)
        with self._lock:
            hit = None
            keep: list[torch.Tensor] = []
            free_bytes = 0
            for t in self._tensors:
                if _storage_use_count(t.untyped_storage()._cdata) > _OWN_USES:
                    keep.append(t)  # in use
                elif hit is None and t.dtype == dtype and tuple(t.shape) == shape:
                    hit = t
                    keep.append(t)
                else:
                    free_bytes += t.numel() * t.element_size()
                    if free_bytes <= self.max_free_bytes:
                        keep.append(t)  # otherwise dropped here: its memory goes back
            if hit is None:
                hit = torch.empty(shape, dtype=dtype)
                keep.append(hit)
                self.allocated += 1
            else:
                self.reused += 1
            self._tensors = keep
            return hit.detach()  # an alias: its own tensor on the same storage, counted there


kv_buffers = BufferPool()
"""The pool every :class:`~rlmesh.rl.models.transformer.KVCache` on CPU allocates from."""
