"""Checkpoint files: tensors and plain values only, each with a checksum beside it.

Why not a plain ``torch.save``/``torch.load``: a checkpoint is a pickle, and the
trainer loads the newest file in its directory on every restart and resume, so a file
planted there would run code with ``weights_only=False``. Here the file is read with
``torch.load(weights_only=True)`` (tensors, numbers, strings, lists, tuples, dicts only:
no code runs) and only after its SHA-256 matches the side file written with it, so a
torn or corrupted file is refused with a clear error, never half-loaded.

Layout, per checkpoint: ``step_00000042.pt`` (the state) and ``step_00000042.json``
(:class:`CheckpointMeta`: format, sha256, bytes, step, version). A ``.pt`` without its
``.json`` is not a checkpoint (a save that died midway, or a stray file): skipped by
:func:`newest` and refused by :func:`read`. Files are created 0600 in a 0700 directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlmesh.errors import RlmeshError
from rlmesh.files import write_atomically

logger = logging.getLogger(__name__)

FORMAT = 1
PATTERN = "step_*.pt"


class CheckpointError(RlmeshError):
    """A checkpoint file that must not be loaded: no checksum beside it, a checksum that does not
    match, or contents that are not plain tensors and values."""


@dataclass(frozen=True)
class CheckpointMeta:
    """The typed side file of one checkpoint."""

    sha256: str
    bytes: int
    step: int
    version: int
    format: int = FORMAT


def meta_path(path: Path) -> Path:
    return path.with_suffix(".json")


def name_for(step: int) -> str:
    return f"step_{step:08d}.pt"


def sha256_of(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of the file at ``path`` (a checkpoint's, or a shard's)."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def write(path: Path, state: dict[str, Any], step: int, version: int) -> None:
    """Atomically write ``state`` (tensors and plain values) and its side file.

    Order: the data to a temporary file, the old side file removed, the data renamed into
    place, the new side file written. A crash at any point leaves either the old pair or a
    ``.pt`` with no side file (skipped), never a pair that disagrees.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
    except (OSError, RuntimeError) as exc:  # a full disk: torch says "enforce fail", its cause the OSError
        tmp.unlink(missing_ok=True)  # a torn file must not keep the space
        os_err = exc if isinstance(exc, OSError) else exc.__context__
        if isinstance(os_err, OSError) and os_err.errno is not None:
            raise OSError(os_err.errno, os.strerror(os_err.errno), str(path)) from exc
        raise
    digest, size = sha256_of(tmp)
    meta_path(path).unlink(missing_ok=True)
    os.replace(tmp, path)
    doc = json.dumps(dataclasses.asdict(CheckpointMeta(digest, size, step, version)))
    write_atomically(meta_path(path), doc, private=True)


def read(path: Path) -> dict[str, Any]:
    """The state in ``path``, after its checksum matched; :class:`CheckpointError` otherwise."""
    path = Path(path)
    try:
        meta = CheckpointMeta(**json.loads(meta_path(path).read_text()))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} has no {meta_path(path).name} beside it (not written by this "
                              f"rlmesh, or its save died midway); refusing to load it. {_set_aside(path, meta=False)}") from None
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint side file {meta_path(path)} is unreadable ({exc}); refusing {path}. "
                              f"{_set_aside(path)}") from exc
    digest, size = sha256_of(path)
    if digest != meta.sha256 or size != meta.bytes:
        raise CheckpointError(f"checkpoint {path} fails its checksum ({size} bytes, sha256 {digest[:12]}..., expected "
                              f"{meta.bytes} bytes, {meta.sha256[:12]}...): it is corrupt or was replaced; refusing "
                              f"to load it. {_set_aside(path)}")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # pickle.UnpicklingError for anything but tensors and plain values
        raise CheckpointError(f"checkpoint {path} holds more than tensors and plain values ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}); refusing to load it. "
                              f"{_set_aside(path)}") from exc


def _set_aside(path: Path, meta: bool = True) -> str:
    """What to do with a refused checkpoint: keep it (it may be evidence) where it is not loaded."""
    also = f"; mv {meta_path(path)} {meta_path(path)}.refused" if meta else ""
    return (f"To resume from the previous checkpoint, move it aside (kept for inspection; never load it): "
            f"mv {path} {path}.refused{also}")


def newest(d: Path | None) -> Path | None:
    """The newest checkpoint in ``d`` that has its side file (``None`` if there is none)."""
    if d is None or not d.is_dir():
        return None
    found = sorted(d.glob(PATTERN))
    for p in reversed(found):
        if meta_path(p).exists():
            return p
        logger.warning("checkpoint %s has no %s beside it: skipped", p, meta_path(p).name)
    return None


def prune(d: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (with their side files)."""
    for old in sorted(d.glob(PATTERN))[:-keep]:
        old.unlink(missing_ok=True)
        meta_path(old).unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    """torch, numpy and Python RNG states as tensors and plain values (loadable with ``weights_only``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": random.getstate()}


def set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    n = s["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    v, internal, gauss = s["python"]
    random.setstate((v, tuple(internal), gauss))
