"""Verify a fetched version, then copy it into the caller's tensors.

Why verify first: a pull must leave its target untouched when the transfer is torn
or corrupt, so every checksum is checked against the source bytes (the shared
segment, the received frames, the RDMA staging region) before a single target byte
changes. The copy then goes straight from the source into the target (one pass,
dtype cast and non-contiguous targets handled by ``Tensor.copy_``).

A *source* is, per manifest entry, the list of its pieces as contiguous uint8 tensors
(one piece for shm and CUDA IPC; one per chunk for TCP and RDMA).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from rlmesh.weights import checksum
from rlmesh.weights.errors import WeightSyncError
from rlmesh.weights.layout import Manifest, TensorEntry, check_target, torch_dtype

Sources = Sequence[Sequence[Any]]


def _piece_sum(p: Any) -> int:
    return checksum.sum64_cuda(p) if p.is_cuda else checksum.sum64(p.numpy())


PARALLEL_ENTRIES = 16 << 20
"""A version whose small entries (each below the sizes that split one entry across the two threads)
add up to more than this sums and copies them on both threads, half the bytes each. Why: a model is
hundreds of tensors of a few MiB, which one at a time ran on one thread: a 248 MiB version's check
and copy then took ~1.8x one memcpy stream, where the floor is one stream."""


def _halves(entries: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """``entries`` cut in two contiguous runs of about half their bytes each."""
    total, run, cut = sum(sizes[i] for i in entries), 0, len(entries)
    for k, i in enumerate(entries):
        run += sizes[i]
        if 2 * run >= total:
            cut = k + 1
            break
    return [list(entries[:cut]), list(entries[cut:])]


def _each_entry(n: int, small: list[int], sizes: Sequence[int], work: Any) -> None:
    """``work(i)`` for every entry ``i < n``: those of ``small`` on the two checksum threads, half the
    bytes each, the others (entries that split themselves across those threads) on this one meanwhile.
    Pool tasks never wait on the pool, so a big entry queued behind the halves cannot deadlock it."""
    futures = [checksum.executor().submit(lambda run: [work(i) for i in run], run)
               for run in _halves(small, sizes) if run]
    chosen = set(small)
    try:
        for i in range(n):
            if i not in chosen:
                work(i)
    finally:
        for f in futures:
            f.result()


def _small_cpu_entries(sources: Sources, limit: int) -> list[int]:
    """Entries of one CPU piece below ``limit`` bytes, if they add up to :data:`PARALLEL_ENTRIES`; else none."""
    small = [i for i, pieces in enumerate(sources)
             if len(pieces) == 1 and not pieces[0].is_cuda and int(pieces[0].numel()) < limit]
    return small if len(small) > 1 and sum(int(sources[i][0].numel()) for i in small) >= PARALLEL_ENTRIES else []


def _sums(m: Manifest, sources: Sources) -> list[int]:
    """Each entry's checksum, small entries on both threads (:func:`_each_entry`)."""
    out = [0] * len(sources)

    def one(i: int) -> None:
        out[i] = checksum.combine([_piece_sum(p) for p in sources[i]])

    _each_entry(len(sources), _small_cpu_entries(sources, checksum.PARALLEL_MIN), [e.nbytes for e in m.entries], one)
    return out


def verify(m: Manifest, sources: Sources, sums: Sequence[int] | None = None) -> None:
    """Raise :class:`WeightSyncError` naming the first entry whose bytes do not match its checksum.

    ``sums``: checksums of exactly these source bytes, already computed as they arrived.
    """
    if len(sources) != len(m.entries):
        raise WeightSyncError(f"version {m.version} of {m.name!r}: got {len(sources)} tensors, manifest lists {len(m.entries)}")
    for e, pieces in zip(m.entries, sources):
        got_len = sum(int(p.numel()) for p in pieces)
        if got_len != e.nbytes:
            raise WeightSyncError(f"version {m.version} of {m.name!r}: {e.key!r} arrived with {got_len} bytes, expected {e.nbytes}")
    sums = sums if sums is not None else _sums(m, sources)
    for e, got in zip(m.entries, sums):
        if got != e.checksum:
            raise WeightSyncError(
                f"version {m.version} of {m.name!r}: checksum mismatch on {e.key!r} "
                f"(torn or corrupt transfer); the target was left untouched")


def _joined(pieces: Sequence[Any]) -> Any:
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    if len(pieces) == 1:
        return pieces[0]
    if not pieces:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat(list(pieces))


def _torch_view(e: TensorEntry, flat: Any) -> Any:
    return flat.view(torch_dtype(e.dtype)).reshape(e.shape)


def _numpy_view(e: TensorEntry, flat: Any) -> np.ndarray:
    return flat.cpu().numpy().view(np.dtype(e.dtype)).reshape(e.shape)


SPLIT = 8 << 20  # a copy larger than this is cut into pieces that run on two threads


def _copy_pieces_bytewise(dst: Any, pieces: Sequence[Any]) -> bool:
    """Copy pieces straight into a contiguous same-dtype CPU target, in parallel; False if not possible."""
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    if not dst.is_contiguous() or dst.device.type != "cpu" or pieces[0].device.type != "cpu":
        return False
    raw = dst.detach().reshape(-1).view(torch.uint8)  # grad mode is per thread: the pool's threads see a plain view
    jobs, pos = [], 0
    for p in pieces:
        n = int(p.numel())
        for off in range(0, n, SPLIT):
            jobs.append((raw[pos + off : pos + min(n, off + SPLIT)], p[off : off + SPLIT]))
        pos += n
    if len(jobs) == 1:
        jobs[0][0].copy_(jobs[0][1])
    else:
        list(checksum.executor().map(lambda j: j[0].copy_(j[1]), jobs))
    return True


def copy_entry(e: TensorEntry, pieces: Sequence[Any], dst: Any) -> None:
    """Copy one verified entry into ``dst`` (torch tensor or numpy array), casting if dtypes differ."""
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    if isinstance(dst, np.ndarray):
        np.copyto(dst, _numpy_view(e, _joined(pieces)), casting="same_kind")
        return
    if e.kind == "numpy":
        src = torch.from_numpy(np.ascontiguousarray(_numpy_view(e, _joined(pieces))))
        with torch.no_grad():
            dst.copy_(src)
        return
    with torch.no_grad():
        big = len(pieces) > 1 or e.nbytes > SPLIT
        if big and dst.dtype == torch_dtype(e.dtype) and _copy_pieces_bytewise(dst, pieces):
            return
        dst.copy_(_torch_view(e, _joined(pieces)))


def copy_into(m: Manifest, sources: Sources, target: Mapping[str, Any], dtype: Any = None) -> None:
    """Check the target's keys and shapes, then copy every entry in place (call :func:`verify` first).

    Small entries into CPU targets copy on both threads, half the bytes each (:func:`_each_entry`)."""
    check_target(m, target, dtype)

    def one(i: int) -> None:
        copy_entry(m.entries[i], sources[i], target[m.entries[i].key])

    small = [i for i in _small_cpu_entries(sources, SPLIT + 1) if not getattr(target[m.entries[i].key], "is_cuda", False)]
    _each_entry(len(m.entries), small, [e.nbytes for e in m.entries], one)


def materialize(m: Manifest, sources: Sources, dtype: Any = None, device: Any = None) -> dict[str, Any]:
    """Fresh tensors (and numpy arrays for numpy entries); ``dtype`` casts floating-point tensors only."""
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    out: dict[str, Any] = {}
    for e, pieces in zip(m.entries, sources):
        if e.kind == "numpy":
            out[e.key] = np.array(_numpy_view(e, _joined(pieces)), copy=True)
            continue
        src_dt = torch_dtype(e.dtype)
        want = dtype if (dtype is not None and src_dt.is_floating_point) else src_dt
        dev = device if device is not None else (pieces[0].device if pieces else "cpu")
        dst = torch.empty(e.shape, dtype=want, device=dev)
        copy_entry(e, pieces, dst)
        out[e.key] = dst
    return out


def module_tensors(module: Any) -> dict[str, Any]:
    """The parameter and buffer objects of a module by state_dict key (not the detached copies
    ``state_dict()`` returns: pointing those at new memory would leave the module as it was)."""
    out = dict(module.named_parameters(remove_duplicate=False))
    out.update(module.named_buffers(remove_duplicate=False))
    return out


def _contiguous_bytes(pieces: Sequence[Any]) -> Any:
    """The pieces as one uint8 view when they lie back to back in one CPU buffer, else None."""
    if not pieces or pieces[0].device.type != "cpu":
        return None
    first = pieces[0]
    ptr = first.data_ptr() + int(first.numel())
    for p in pieces[1:]:
        if p.data_ptr() != ptr or p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr():
            return None
        ptr += int(p.numel())
    if len(pieces) == 1:
        return first
    start = first.storage_offset()
    return first.new_empty(0).set_(first.untyped_storage(), start, (ptr - first.data_ptr(),), (1,))


def swap_into(m: Manifest, sources: Sources, tensors: Mapping[str, Any]) -> bool:
    """Point every tensor of a module at its verified bytes in the sources (no copy): all or nothing.

    Only when every entry is a torch tensor whose target is a CPU tensor of the same dtype and shape
    and whose bytes lie contiguous and aligned in one CPU buffer; otherwise False and nothing changed
    (the caller copies). The tensor objects stay the same (``set_``), so the module, its hooks and
    anything holding the parameters see the new values; a view taken from them before (``detach()``,
    an earlier ``state_dict()``) keeps the old bytes.
    """
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    plan = []
    for e, pieces in zip(m.entries, sources):
        dst = tensors.get(e.key)
        if e.kind == "numpy" or dst is None or not isinstance(dst, torch.Tensor) or dst.device.type != "cpu":
            return False
        dt = torch_dtype(e.dtype)
        if dst.dtype != dt or tuple(dst.shape) != tuple(e.shape):
            return False
        flat = _contiguous_bytes(pieces)
        if flat is None or flat.data_ptr() % max(1, dt.itemsize):
            return False
        plan.append((dst, flat, dt, e.shape))
    with torch.no_grad():
        for dst, flat, dt, shape in plan:
            dst.set_(flat.view(dt).reshape(shape))
    return True


def as_state_dict(target: Any) -> Mapping[str, Any]:
    """Accept a state_dict or a module (whose ``state_dict()`` tensors alias its parameters)."""
    if isinstance(target, Mapping):
        return target
    if hasattr(target, "state_dict"):
        return target.state_dict()
    raise TypeError(f"pull_into needs a state_dict or an nn.Module, got {type(target).__name__}")
