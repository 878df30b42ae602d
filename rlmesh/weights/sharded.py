"""Weights published in shards: every rank of a trainer mesh publishes its own part of each version.

    pub = ShardPublisher("policy", rank, world, set_id)          # on every rank
    pub.publish({"w": ShardPiece(local_rows, full_shape, start)}, version=step)
    sub = rm.weights.Subscriber("policy")                         # unchanged: it sees the set
    sub.pull_into(model, min_version=step)                        # pulls from every rank at once

Why: gathering a sharded model to one rank before publishing costs a collective of the whole
model every version, and that rank's memory; with shards, each rank copies only what it holds
into its own publisher (:class:`~rlmesh.weights.publisher.Publisher`, shm slots served over TCP
and RDMA as ever), and a reader fetches the parts from every rank in parallel and copies them
into place (:mod:`rlmesh.weights.shard_reader`).

**A shard** of a tensor is a contiguous run of its elements in row-major order: ``start`` is the
index of its first element in the whole tensor. An FSDP2 rank's local shard (rows ``a..b`` of
dim 0) is one; a replicated tensor is cut into ``world`` runs (:meth:`ShardPiece.of_replica`).
Each rank's version is a normal manifest whose entries are its runs (flat), plus, in its
``extra``, the ``shard`` record: the set, the rank, the world and per entry the whole tensor's
shape and ``start``.

**Atomic versions.** A version of the set exists only once every rank has published it: a
reader takes the newest version all ranks hold, fetches it from each, and delivers it only if
every manifest names that version, this set (:attr:`set_id`, one per trainer-mesh incarnation),
its own rank, the same world, keys, dtypes and shapes, and if the runs of each tensor tile it
exactly. A rank that died mid-publish leaves its previous version, so the set's newest complete
version is the previous one: never a mix. Each run keeps its own checksum, so every byte is
still covered.

The directory holds one record per rank (:func:`shard_name`) and, from rank 0, the set's record
under the plain name (``{"shards": [...], "world", "set", ...}``), which a ``Subscriber`` of that
name recognises.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rlmesh.weights.directory import Directory, default_directory, publisher_key, this_host, this_proc_id
from rlmesh.weights.layout import Manifest
from rlmesh.weights.publisher import TRANSPORTS, Publisher
from rlmesh.weights.stats import PublishStats

FORMAT = 1
"""Version of the ``shard`` record in a manifest's ``extra``."""


def shard_name(name: str, rank: int) -> str:
    """The name rank ``rank`` of a sharded set publishes its part of ``name`` under."""
    return f"{name}.shard{rank}"


@dataclass(frozen=True)
class ShardPiece:
    """One rank's part of one tensor: ``tensor`` holds elements ``start .. start + numel`` of the
    whole tensor of shape ``shape`` (row-major), in its dtype; any shape, read flat."""

    tensor: Any
    shape: tuple[int, ...]
    start: int

    @classmethod
    def of_replica(cls, tensor: Any, rank: int, world: int) -> "ShardPiece":
        """Rank ``rank``'s run of a tensor every rank holds whole (a buffer, a DDP replica): the
        elements cut into ``world`` runs of ``ceil(numel / world)``, the last ones shorter or empty."""
        flat = tensor.detach().reshape(-1)
        n = int(flat.numel())
        per = math.ceil(n / world) if n else 0
        start = min(rank * per, n)
        return cls(flat[start:min(start + per, n)], tuple(int(s) for s in tensor.shape), start)


@dataclass(frozen=True)
class ShardMeta:
    """The ``shard`` record of one rank's manifest, decoded (a reader checks it before any byte)."""

    set_id: str
    rank: int
    world: int
    layout: tuple[tuple[str, tuple[int, ...], int], ...]
    """Per entry, in the manifest's order: key, the whole tensor's shape, ``start``."""

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "set": self.set_id, "rank": self.rank, "world": self.world,
                "layout": [[k, list(shape), start] for k, shape, start in self.layout]}

    @classmethod
    def of(cls, m: Manifest) -> "ShardMeta | None":
        """The record in ``m``'s extra, or ``None`` when it carries none (or one this rlmesh cannot read)."""
        doc = m.extra.get("shard")
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return None
        try:
            layout = tuple((str(k), tuple(int(s) for s in shape), int(start)) for k, shape, start in doc["layout"])
            return cls(str(doc["set"]), int(doc["rank"]), int(doc["world"]), layout)
        except (KeyError, TypeError, ValueError):
            return None


class ShardPublisher:
    """Rank ``rank`` of ``world`` publishing its shards of ``name``; rank 0 also writes the set's record.

    ``set_id`` is the same on every rank of one incarnation of the mesh and new at each restart
    (a trainer mesh passes its group's epoch token): a reader never joins the shards of a rank that
    died to those of its successors. Other arguments as :class:`~rlmesh.weights.publisher.Publisher`.
    """

    def __init__(self, name: str, rank: int, world: int, set_id: str, *, keep: int = 2,
                 transports: Sequence[str] = TRANSPORTS, directory: Directory | None = None,
                 host: str | None = None) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in 0..{world - 1} (world={world})")
        self.name, self.rank, self.world, self.set_id = name, rank, world, set_id
        self.directory = directory if directory is not None else default_directory()
        self.publisher = Publisher(shard_name(name, rank), keep=keep, transports=transports,
                                   directory=self.directory, host=host)
        self._record = {"name": name, "shards": [shard_name(name, r) for r in range(world)], "world": world,
                        "set": set_id, "pid": os.getpid(), "proc": this_proc_id(), "host": this_host(), "keep": keep}
        # "proc" and "pid": the controller withdraws the record when rank 0's proc dies (rlmesh.weights.plugin)
        if rank == 0:
            self.directory.put(publisher_key(name), self._record)

    def _split(self, pieces: Mapping[str, ShardPiece]) -> tuple[dict[str, Any], dict[str, Any]]:
        flat = {k: p.tensor.reshape(-1) for k, p in pieces.items()}
        meta = ShardMeta(self.set_id, self.rank, self.world,
                         tuple((k, tuple(int(s) for s in p.shape), int(p.start)) for k, p in pieces.items()))
        return flat, {"shard": meta.to_json()}

    def reserve(self, pieces: Mapping[str, ShardPiece], *, wait: bool = False) -> None:
        """Reserve this rank's shm slots ahead (:meth:`Publisher.reserve`)."""
        flat, meta = self._split(pieces)
        self.publisher.reserve(flat, wait=wait, meta=meta)

    def publish(self, pieces: Mapping[str, ShardPiece], version: int) -> PublishStats:
        """Publish this rank's ``pieces`` as ``version``; the set's version is readable once every
        rank has published it. Every rank passes the same keys, in the same order."""
        flat, meta = self._split(pieces)
        return self.publisher.publish(flat, version, meta=meta)

    def close(self) -> None:
        """Close this rank's publisher; rank 0 withdraws the set's record if it is still its own."""
        self.publisher.close()
        if self.rank == 0:
            try:
                rec = self.directory.get(publisher_key(self.name), 0)
                if rec and rec.get("set") == self.set_id and rec.get("pid") == os.getpid():
                    self.directory.delete(publisher_key(self.name))
            except Exception:  # noqa: BLE001 - the directory may be gone at shutdown; the record then is too
                pass

    def __enter__(self) -> "ShardPublisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
