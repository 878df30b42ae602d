"""Splitting a train batch across the ranks of a trainer mesh, so N ranks take the step one rank would.

Pure functions (no process group): the group's reductions are passed in.

Two things make a data-parallel step equal to the single-rank one:

1. **The same samples are trained on.** For GRPO a sample is a *group* (a prompt's completions),
   and the step trains on the first ``max_groups`` informative groups of the batch
   (:func:`~rlmesh.rl.algorithms.grpo.grpo_update`). :func:`split_groups` picks those on rank 0,
   over the whole batch, and deals them round-robin, so every rank gets its share and the
   per-rank update finds nothing more to cut. Uninformative groups (no gradient) are dealt too,
   for the reward metrics.
2. **The per-rank losses add up to the one-rank loss.** FSDP and DDP *average* gradients over the
   ranks; a rank's loss is a mean over its own tokens (or sequences), so ranks holding different
   numbers of tokens would be weighed wrongly. Each rank's loss is scaled by its *rank weight*,
   ``world * local_units / global_units`` (:func:`rank_weight`, with the units of
   :func:`grpo_units`), so the averaged gradient is the gradient of the mean over every token of
   the batch, as on one rank (:class:`RankWeightedLoss`).

Every rank must run the same number of forward and backward passes (FSDP's collectives pair
them up), micro-batches included. So every rank gets the same number of informative groups: the
chosen ones are cut to a multiple of the rank count (at most ``world - 1`` informative groups a
step are left out that one rank would have trained on), and fewer than ``world`` of them means
none is trained this step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def deal(n: int, world: int) -> list[list[int]]:
    """Indices ``0..n-1`` dealt round-robin to ``world`` ranks."""
    return [list(range(r, n, world)) for r in range(world)]


def split_groups(batch: list[dict[str, Any]], world: int,
                 advantages: Callable[[torch.Tensor, int], torch.Tensor],
                 max_groups: int | None = None) -> list[list[dict[str, Any]]]:
    """GRPO work items (``completions``, ``rewards``, ``group_size``, ...) split into ``world`` shards
    of whole groups; see the module docstring for what is dealt where.

    ``advantages`` is the trainer's ``compute_advantages`` hook, called once on the whole batch, so the
    groups counted informative are the ones one rank would train on.
    """
    group_size = batch[0]["group_size"]
    groups: list[tuple[int, int]] = []  # (item index, group index within the item)
    for i, item in enumerate(batch):
        groups += [(i, g) for g in range(len(item["completions"]) // group_size)]
    rewards = torch.tensor([r for item in batch for r in item["rewards"]], dtype=torch.float32)
    informative = (advantages(rewards, group_size).view(-1, group_size).abs().sum(1) > 0).tolist()
    chosen = [k for k, yes in enumerate(informative) if yes][:max_groups]
    chosen = chosen[:len(chosen) - len(chosen) % world]  # the same count on every rank: see the module docstring
    rest = [k for k, yes in enumerate(informative) if not yes]
    per_rank: list[list[int]] = [[] for _ in range(world)]
    for r, picks in enumerate(deal(len(chosen), world)):
        per_rank[r] += [chosen[j] for j in picks]
    for j, k in enumerate(rest):  # continue the deal where the informative groups stopped
        per_rank[(len(chosen) + j) % world].append(k)
    return [_items(batch, sorted(ks), groups, group_size) for ks in per_rank]


def _items(batch: list[dict[str, Any]], ks: list[int], groups: list[tuple[int, int]],
           group_size: int) -> list[dict[str, Any]]:
    """The groups ``ks`` (indices into ``groups``) as work items, one per source item, in batch order."""
    out: dict[int, dict[str, Any]] = {}
    for k in ks:
        i, g = groups[k]
        item = batch[i]
        part = out.setdefault(i, {**item, "completions": [], "rewards": []})
        part["completions"] += item["completions"][g * group_size:(g + 1) * group_size]
        part["rewards"] += list(item["rewards"][g * group_size:(g + 1) * group_size])
    return [out[i] for i in sorted(out)]


class ScaledLoss:
    """A loss result whose ``.loss`` is rescaled for the gradient reduction; ``.metrics()`` are the
    unscaled ones of the loss it wraps."""

    def __init__(self, inner: Any, loss: torch.Tensor) -> None:
        self.inner, self.loss = inner, loss

    def metrics(self) -> dict[str, float]:
        return self.inner.metrics()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class RankWeightedLoss:
    """``loss_fn`` whose ``.loss`` is multiplied by ``weight()``, this rank's weight for the current step
    (:func:`rank_weight`); metrics stay unscaled. Wraps a trainer's ``compute_loss`` hook on a trainer mesh."""

    def __init__(self, loss_fn: Callable[..., Any], weight: Callable[[], float]) -> None:
        self.loss_fn, self.weight = loss_fn, weight

    def __call__(self, *args: Any, **kwargs: Any) -> ScaledLoss:
        out = self.loss_fn(*args, **kwargs)
        return ScaledLoss(out, out.loss * self.weight())


def rank_weight(units: float, total: float, world: int) -> float:
    """What a rank's loss (a mean over its ``units``) is multiplied by so that the gradient averaged over
    ``world`` ranks is the gradient of the mean over all ``total`` units: ``world * units / total``."""
    return world * units / total if total > 0 else 0.0


def grpo_units(batch: list[dict[str, Any]], advantages: Callable[[torch.Tensor, int], torch.Tensor],
               aggregation: str, informative_only: bool = True) -> float:
    """What a GRPO step on ``batch`` averages its loss over: the trained tokens of its informative
    groups (``token_mean``), or their completions (``sequence_mean``, ``sequence_sum_norm``); with
    ``informative_only=False``, of every group (the whole batch's mean, ``grpo.batch_rows``). Exact
    for both; for ``sequence_sum_norm`` with ``norm_length`` unset each rank divides by its own
    padded width, where one rank divides by the batch's."""
    if not batch:
        return 0.0
    rows = [c for item in batch for c in item["completions"]]
    if informative_only:
        group_size = batch[0]["group_size"]
        rewards = torch.tensor([r for item in batch for r in item["rewards"]], dtype=torch.float32)
        informative = advantages(rewards, group_size).view(-1, group_size).abs().sum(1) > 0
        rows = [c for g in informative.nonzero().flatten().tolist() for c in rows[g * group_size:(g + 1) * group_size]]
    if aggregation != "token_mean":
        return float(len(rows))
    return float(sum(sum(c.loss_mask) if getattr(c, "loss_mask", None) is not None else len(c.token_ids)
                     for c in rows))


def merge_metrics(per_rank: list[dict[str, float]], summed: frozenset[str] | set[str] = frozenset()) -> dict[str, float]:
    """One metrics dict from every rank's: the mean over the ranks that report a key, or the sum for
    keys in ``summed`` (counts such as ``train/groups``)."""
    keys = dict.fromkeys(k for m in per_rank for k in m)
    out = {}
    for k in keys:
        vals = [m[k] for m in per_rank if k in m]
        out[k] = float(sum(vals)) if k in summed else float(sum(vals) / len(vals))
    return out
