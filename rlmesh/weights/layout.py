"""Where each tensor of a version lives in the flat buffer, and the manifest that describes it.

Why a flat buffer: every transport moves one contiguous region (a shared-memory
segment, TCP chunks of it, RDMA READs of one registered memory region, one CUDA IPC
allocation), so there is one layout and one manifest format for all of them. The
manifest is JSON, never pickle: a reader decodes it before it trusts anything.

Entries start at 64-byte boundaries, so chunks cut at multiples of 64 keep the
checksum additive (see :mod:`rlmesh.weights.checksum`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from rlmesh.weights.errors import StateDictMismatchError

ALIGN = 64
MANIFEST_FORMAT = 1


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class TensorEntry:
    """One tensor (or numpy array) of a version: ``kind`` is ``"torch"`` or ``"numpy"``."""

    key: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    checksum: int = 0

    def to_json(self) -> list[Any]:
        return [self.key, self.kind, self.dtype, list(self.shape), self.offset, self.nbytes, self.checksum]

    @classmethod
    def from_json(cls, row: list[Any]) -> "TensorEntry":
        key, kind, dtype, shape, offset, nbytes, checksum = row
        return cls(str(key), str(kind), str(dtype), tuple(int(s) for s in shape), int(offset), int(nbytes), int(checksum))


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to rebuild one version from its flat buffer."""

    name: str
    version: int
    total: int
    entries: tuple[TensorEntry, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        doc = {
            "format": MANIFEST_FORMAT,
            "name": self.name,
            "version": self.version,
            "total": self.total,
            "entries": [e.to_json() for e in self.entries],
            "extra": self.extra,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | memoryview) -> "Manifest":
        doc = json.loads(bytes(raw))
        if doc.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unknown weight manifest format {doc.get('format')!r}; upgrade rlmesh on both sides")
        entries = tuple(TensorEntry.from_json(r) for r in doc["entries"])
        return cls(doc["name"], int(doc["version"]), int(doc["total"]), entries, dict(doc.get("extra") or {}))

    def signature(self) -> tuple:
        """Keys, kinds, dtypes and shapes: equal signatures share one layout."""
        return tuple((e.key, e.kind, e.dtype, e.shape) for e in self.entries)


def _torch():
    import torch  # deferred: torch is heavy; weights of numpy arrays never load it

    return torch


def dtype_name(value: Any) -> tuple[str, str]:
    """``(kind, dtype)`` of a state_dict value, or a ``TypeError`` naming what is supported."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("numpy arrays of Python objects cannot be shared as weights")
        return "numpy", value.dtype.newbyteorder("<").str if value.dtype.byteorder == ">" else value.dtype.str
    torch = _torch()
    if isinstance(value, torch.Tensor):
        if value.is_sparse or value.is_quantized or value.layout != torch.strided:
            raise TypeError("only dense (strided) tensors can be shared as weights")
        return "torch", str(value.dtype).removeprefix("torch.")
    raise TypeError(f"weights must be torch tensors or numpy arrays, got {type(value).__name__}")


def torch_dtype(name: str) -> Any:
    torch = _torch()
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r} in manifest")
    return dt


def itemsize(kind: str, dtype: str) -> int:
    if kind == "numpy":
        return np.dtype(dtype).itemsize
    return torch_dtype(dtype).itemsize


def plan_layout(name: str, version: int, state_dict: Mapping[str, Any]) -> Manifest:
    """Assign each value an aligned offset (checksums are filled in once the bytes are written)."""
    if not isinstance(state_dict, Mapping) or not state_dict:
        raise TypeError("publish() needs a non-empty mapping of name -> tensor (e.g. model.state_dict())")
    entries = []
    off = 0
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f"state_dict keys must be str, got {key!r}")
        try:
            kind, dt = dtype_name(value)
        except TypeError as exc:
            raise TypeError(f"state_dict[{key!r}]: {exc}") from None
        shape = tuple(int(s) for s in value.shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize(kind, dt)
        entries.append(TensorEntry(key, kind, dt, shape, off, nbytes))
        off = align_up(off + nbytes)
    return Manifest(name, int(version), max(off, ALIGN), tuple(entries))


def with_checksums(m: Manifest, sums: Iterable[int], version: int, extra: dict[str, Any] | None = None) -> Manifest:
    entries = tuple(
        TensorEntry(e.key, e.kind, e.dtype, e.shape, e.offset, e.nbytes, int(s)) for e, s in zip(m.entries, sums)
    )
    return Manifest(m.name, int(version), m.total, entries, dict(extra or {}))


@dataclass(frozen=True)
class Piece:
    """Part of entry ``entry`` that lies in chunk ``chunk`` at ``start`` (relative to the chunk)."""

    entry: int
    chunk: int
    start: int
    length: int


def plan_chunks(m: Manifest, chunk_bytes: int) -> tuple[list[tuple[int, int]], list[list[Piece]]]:
    """Cut the used bytes into ``(offset, length)`` chunks of at most ``chunk_bytes`` and map entries onto them.

    Chunks skip the alignment padding between entries only when it would start a new
    chunk; within a chunk, small entries and their padding travel together (one frame,
    one RDMA READ). Returns the chunks and, per entry, its pieces in order.
    """
    if chunk_bytes < ALIGN or chunk_bytes % ALIGN:
        raise ValueError(f"chunk_bytes must be a positive multiple of {ALIGN}, got {chunk_bytes}")
    chunks: list[tuple[int, int]] = []
    pieces: list[list[Piece]] = [[] for _ in m.entries]
    cur_start: int | None = None
    cur_end = 0
    for i, e in enumerate(m.entries):
        pos, end = e.offset, e.offset + e.nbytes
        if e.nbytes == 0:
            continue
        while pos < end:
            if cur_start is None or pos - cur_start >= chunk_bytes:
                if cur_start is not None:
                    chunks.append((cur_start, cur_end - cur_start))
                cur_start = pos
            take = min(end, cur_start + chunk_bytes) - pos
            pieces[i].append(Piece(i, len(chunks), pos - cur_start, take))
            pos += take
            cur_end = pos
    if cur_start is not None:
        chunks.append((cur_start, cur_end - cur_start))
    return chunks, pieces


def check_target(m: Manifest, target: Mapping[str, Any], dtype: Any = None) -> None:
    """Raise :class:`StateDictMismatchError` naming the first key whose presence or shape differs."""
    published = {e.key: e for e in m.entries}
    for key, t in target.items():
        e = published.get(key)
        if e is None:
            raise StateDictMismatchError(
                f"target key {key!r} is not in published version {m.version} of {m.name!r} "
                f"({len(published)} keys); is the generator's model the trainer's architecture?", key)
        shape = tuple(int(s) for s in t.shape)
        if shape != e.shape:
            raise StateDictMismatchError(
                f"key {key!r}: published shape {e.shape} but target has {shape} (version {m.version} of {m.name!r})", key)
        if dtype is not None and getattr(t, "is_floating_point", lambda: False)() and t.dtype != dtype:
            raise StateDictMismatchError(
                f"key {key!r}: dtype={dtype} was asked for but the target tensor is {t.dtype}", key)
    for e in m.entries:
        if e.key not in target:
            raise StateDictMismatchError(
                f"published key {e.key!r} (version {m.version} of {m.name!r}) is missing from the target state_dict", e.key)
