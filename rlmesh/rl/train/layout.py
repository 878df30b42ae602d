"""Checkpoint names and checks shared by both kinds: single ``step_*.pt`` files
(:mod:`rlmesh.rl.checkpoint`) and sharded ``step_*.dcp`` directories (:mod:`rlmesh.rl.train.dcp`).

Light on purpose: no ``torch.distributed`` import (DCP and FSDP cost ~2 s of CPU to import), so a
one-rank trainer finds its newest checkpoint of either kind without paying for them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from rlmesh.rl import checkpoint
from rlmesh.rl.checkpoint import CheckpointError, sha256_of

SUFFIX = ".dcp"
MANIFEST = "manifest.json"
PLAIN = "trainer.pt"
_STEP = re.compile(r"step_(\d+)\.(pt|dcp)$")


def name_for(step: int) -> str:
    """The directory name of step ``step``'s sharded checkpoint."""
    return f"step_{step:08d}{SUFFIX}"


def verify(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint directory ``path`` once every file in it matches (and no file is
    missing or extra); :class:`CheckpointError` otherwise."""
    path = Path(path)
    try:
        doc = json.loads((path / MANIFEST).read_text())
        listed = doc["files"]
    except FileNotFoundError:
        raise CheckpointError(f"sharded checkpoint {path} has no {MANIFEST} (not written by rlmesh); refusing it") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path / MANIFEST} is unreadable ({exc}); refusing {path}") from exc
    present = {p.name for p in path.iterdir() if p.is_file()} - {MANIFEST}
    if present != set(listed):
        raise CheckpointError(f"sharded checkpoint {path}: files {sorted(present ^ set(listed))} are missing or not "
                              "in its manifest; refusing it. Delete it to resume from the previous checkpoint")
    for name, want in listed.items():
        digest, size = sha256_of(path / name)
        if digest != want["sha256"] or size != want["bytes"]:
            raise CheckpointError(f"sharded checkpoint {path}: {name} fails its checksum (corrupt or replaced); "
                                  "refusing it. Delete it to resume from the previous checkpoint")
    return doc


def step_of(path: Path) -> int | None:
    m = _STEP.search(Path(path).name)
    return int(m.group(1)) if m else None


def newest(d: Path | None) -> Path | None:
    """The newest checkpoint in ``d`` of either kind: a ``step_*.pt`` with its side file, or a
    ``step_*.dcp`` directory (``None`` if there is none)."""
    if d is None or not d.is_dir():
        return None
    found = [p for p in d.glob(f"step_*{SUFFIX}") if p.is_dir()]
    single = checkpoint.newest(d)
    if single is not None:
        found.append(single)
    return max(found, key=lambda p: step_of(p) or -1, default=None)


def prune(d: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints of either kind."""
    found = sorted([*d.glob(checkpoint.PATTERN), *(p for p in d.glob(f"step_*{SUFFIX}") if p.is_dir())],
                   key=lambda p: step_of(p) or -1)
    for old in found[:-keep]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
            checkpoint.meta_path(old).unlink(missing_ok=True)
