"""What each rank of a trainer mesh publishes under ``trainer.publish=sharded``: its own part.

Under FSDP2 a rank holds, of every parameter, the rows of dim 0 that ``fully_shard`` gave it (a
``DTensor`` placed ``Shard(0)``): rows ``a..b`` of a row-major tensor are one contiguous run of its
elements, so the rank publishes exactly the local shard it already holds, with no collective and no
copy beyond the one into its publisher's slot. What every rank holds whole (buffers, and every
tensor under DDP) is cut into one run per rank (:meth:`~rlmesh.weights.sharded.ShardPiece.of_replica`),
so the ranks share that copying too. Generators assemble the whole tensors from every rank's runs
(:mod:`rlmesh.weights.shard_reader`).
"""

from __future__ import annotations

import math

from torch import nn
from torch.distributed.tensor import DTensor

from rlmesh.rl.train.distributed import unwrap
from rlmesh.weights.sharded import ShardPiece


def local_pieces(model: nn.Module, rank: int, world: int) -> dict[str, ShardPiece]:
    """This rank's part of ``model``'s state dict (the keys of the unwrapped module, in its order),
    as runs of the whole tensors; see the module docstring."""
    out: dict[str, ShardPiece] = {}
    for key, t in unwrap(model).state_dict().items():
        out[key] = _piece(key, t, rank, world) if isinstance(t, DTensor) else ShardPiece.of_replica(t, rank, world)
    return out


def _piece(key: str, t: DTensor, rank: int, world: int) -> ShardPiece:
    local = t.to_local().detach()
    if all(p.is_replicate() for p in t.placements):
        return ShardPiece.of_replica(local, rank, world)
    shape = tuple(int(s) for s in t.shape)
    (chunk,) = t.__create_chunk_list__()  # the block of the whole tensor this rank holds (what DCP saves)
    offsets, sizes = tuple(int(o) for o in chunk.offsets), tuple(int(s) for s in chunk.sizes)
    if local.numel() and (any(offsets[1:]) or sizes[1:] != shape[1:]):
        raise ValueError(f"{key!r}: rank {rank} holds a block of it that is not whole rows ({t.placements}), which "
                         "is not one run of its elements; use trainer.publish=gathered for this sharding")
    row = math.prod(shape[1:])
    return ShardPiece(local.contiguous() if not local.is_contiguous() else local, shape,
                      offsets[0] * row if local.numel() else 0)


__all__ = ["local_pieces"]
