"""Sharded checkpoints: ``torch.distributed.checkpoint`` (DCP) directories, loadable at any rank count.

Layout, per checkpoint, a directory ``step_00000042.dcp/``:

- ``__<rank>_0.distcp``: each rank's shard of the model and optimizer state and of the frozen
  modules the trainer checkpoints (``Trainer.checkpointed_modules``: a KL reference that is not the
  model folder), and ``.metadata`` (which shard holds which slice of which tensor), written by DCP;
- ``trainer.pt`` + ``trainer.json``: rank 0's plain state (step, version, buffer cursor, RNG,
  the trainer's ``checkpoint_extra``), written by :func:`rlmesh.rl.checkpoint.write`;
- ``manifest.json``: the SHA-256 and size of every other file (:mod:`rlmesh.rl.train.layout`).

The directory is written under a temporary name and renamed once complete, so a directory named
``step_*.dcp`` is a whole checkpoint and a save that died midway leaves only a hidden ``.tmp``.
DCP's ``.metadata`` is a pickle: every rank checks every file against the manifest before DCP
reads anything (:func:`~rlmesh.rl.train.layout.verify`), as :mod:`rlmesh.rl.checkpoint` does for single files.

Loading reshards: the same directory loads into 1, 2 or N ranks, FSDP or DDP or a plain module
(with no process group at all), because DCP matches tensors by name and slices them to what each
rank holds. A single-file checkpoint of a one-rank trainer loads into a sharded trainer too
(:func:`load_file_into`). Names, the search for the newest checkpoint of either kind and the
checksums are in :mod:`rlmesh.rl.train.layout`, which loads no ``torch.distributed`` module
(importing DCP and FSDP costs ~2 s of CPU, which a one-rank trainer never pays).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)

from rlmesh.files import write_atomically
from rlmesh.rl import checkpoint
from rlmesh.rl.train.distributed import TrainGroup, unwrap
from rlmesh.rl.train.layout import MANIFEST, PLAIN, sha256_of, verify


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, plain: dict[str, Any], step: int,
         version: int, group: TrainGroup | None = None, frozen: dict[str, nn.Module] | None = None) -> Path:
    """Write a sharded checkpoint at ``path`` (a ``step_*.dcp`` directory). Every rank calls it;
    ``plain`` (rank 0's) is written by rank 0. ``frozen``: modules without optimizer state saved beside
    the model, each rank its own shard (under FSDP2 nothing is gathered; :func:`load_frozen` reads them)."""
    path = Path(path)
    rank0 = group is None or group.rank == 0
    tmp = path.with_name(f".{path.name}.tmp")
    if rank0:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700)
    if group is not None:
        group.barrier()
    msd, osd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    if frozen:
        state["frozen"] = {name: get_model_state_dict(m) for name, m in frozen.items()}
    dcp.save(state, checkpoint_id=str(tmp))
    if group is not None:
        group.barrier()  # every shard is on disk
    if rank0:
        checkpoint.write(tmp / PLAIN, plain, step, version)
        files = {p.name: sha256_of(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        doc = {"format": 1, "step": step, "version": version, "ranks": 1 if group is None else group.world,
               "files": {name: {"sha256": d, "bytes": n} for name, (d, n) in files.items()}}
        write_atomically(tmp / MANIFEST, json.dumps(doc), private=True)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    if group is not None:
        group.barrier()  # no rank goes on before the checkpoint is whole
    return path


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load a sharded checkpoint into ``model`` and ``optimizer`` (sharded or not, at any rank count)
    after :func:`verify`; returns the plain state of ``trainer.pt``. Every rank calls it."""
    path = Path(path)
    verify(path)
    plain = checkpoint.read(path / PLAIN)
    msd, osd = get_state_dict(model, optimizer)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)
    return plain


def load_frozen(path: Path, frozen: dict[str, nn.Module]) -> None:
    """The frozen modules :func:`save` wrote into ``frozen``'s (sharded or not, at any rank count), in
    place. Every rank calls it, after :func:`load` verified the directory."""
    state = {"frozen": {name: get_model_state_dict(m) for name, m in frozen.items()}}
    dcp.load(state, checkpoint_id=str(Path(path)))
    for name, m in frozen.items():
        set_model_state_dict(m, state["frozen"][name])


def load_file_into(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A one-rank checkpoint's ``model`` and ``optimizer`` (full, as ``state_dict()`` gives them) into a
    sharded ``model``: the optimizer's parameter numbers become parameter names, in the order
    ``model.parameters()`` lists them (the order the optimizer was built in)."""
    names = [n for n, _ in unwrap(model).named_parameters()]
    osd = state["optimizer"]
    named = {"state": {names[i]: s for i, s in osd["state"].items()},
             "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]}
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=named,
                   options=StateDictOptions(full_state_dict=True))
