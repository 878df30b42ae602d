"""DAPO (Yu et al., 2025), top to bottom: GRPO with the four changes that keep long RL runs healthy,
three of which matter at this scale and are here:

1. **Advantages**: GRPO's group-relative ``(r - mean_g) / std_g``
   (:func:`~rlmesh.rl.algorithms.grpo.grpo_advantages`).
2. **Dynamic sampling** (:func:`informative_groups`, :meth:`DAPOTrainer.train`): a group whose
   completions all got the same reward has zero advantage and no gradient; as the policy improves,
   most groups become unanimous and the effective batch shrinks. DAPO drops those groups and
   *refills* the batch with new ones until ``max_groups`` informative groups are there. Here the
   trainer samples further work items from the buffer (up to ``max_refills`` times per step) while
   it has fewer than ``max_groups``; the update then trains on the first ``max_groups``.
3. **Clip-higher** (``clip_coef_high`` 0.28 > ``clip_coef`` 0.2): the ratio's upper clip is looser
   than its lower one, so low-probability tokens that were rewarded can still grow (entropy does
   not collapse).
4. **Token-level loss** (``aggregation=token_mean``): every completion token weighs the same
   across the batch, instead of each sequence weighing the same (which under-weights the tokens
   of long answers).

The loss and update are GRPO's (:func:`~rlmesh.rl.algorithms.grpo.grpo_loss`,
:func:`~rlmesh.rl.algorithms.grpo.grpo_update`) with these settings; DAPO's overlong-reward shaping is
not implemented (completions here are a few tokens long). No KL term, as in the paper.
"""

from __future__ import annotations

from typing import Any

import torch

import rlmesh as rm
from rlmesh.rl.algorithms.configs import DAPOConfig
from rlmesh.rl.results import TrainResult
from rlmesh.rl.algorithms.grpo import GRPOTrainer


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[num_groups]`` bool: groups whose rewards are not all equal (they carry a gradient)."""
    grouped = rewards.view(-1, group_size)
    return (grouped != grouped[:, :1]).any(dim=1)


def count_informative(items: list[dict[str, Any]]) -> int:
    """Informative groups across scored work items (each: ``rewards`` flat, ``group_size``)."""
    return sum(int(informative_groups(torch.as_tensor(item["rewards"], dtype=torch.float32),
                                      item["group_size"]).sum()) for item in items)


class DAPOTrainer(GRPOTrainer):
    """GRPO's trainer whose ``train`` refills the batch with more work items while it has fewer than
    ``max_groups`` informative groups (dynamic sampling); the update is GRPO's with DAPO's settings."""

    config: DAPOConfig
    _refills = 0

    def train_step(self, batch: list[dict[str, Any]]) -> dict[str, float]:
        metrics = super().train_step(batch)
        metrics["train/refills"] = float(self._refills)
        return metrics

    @rm.endpoint
    def train(self, batch_size: int, timeout: float = 60.0) -> TrainResult:
        """Sample ``batch_size`` work items, refill up to ``max_refills`` times, train once, publish.

        Each refill is leased after the previous batch (its cursor is that batch's lease), so a
        restarted trainer gets every batch of a lost step back from the buffer.
        """
        if self.buffer is None:
            raise RuntimeError("DAPOTrainer was built without a buffer; call train_step() directly")
        res = self.buffer.sample.call_one(batch_size, self.version, timeout, self.cursor, self.durable_cursor).get()
        dropped, requeued = list(res.dropped), list(res.requeued)
        rollouts, lease, max_lag, refills = list(res.rollouts), res.lease, res.max_lag or 0, 0
        assert self.config.max_groups is not None
        while rollouts and refills < self.config.max_refills and \
                count_informative([r.data for r in rollouts]) < self.config.max_groups:
            more = self.buffer.sample.call_one(batch_size, self.version, self.config.refill_timeout_s, lease,
                                               self.durable_cursor).get()
            dropped += more.dropped
            requeued += more.requeued
            if not more.rollouts:
                break
            rollouts += more.rollouts
            lease, max_lag, refills = more.lease, max(max_lag, more.max_lag or 0), refills + 1
        if rollouts:
            self._refills = refills
            out = self.learn([r.data for r in rollouts], max_lag=max_lag, cursor=lease)
            out.rollout_ids = [r.rollout_id for r in rollouts]
        else:
            out = TrainResult(self.step, self.version, self.samples_seen)
        out.dropped, out.drop_reasons = [d.rollout_id for d in dropped], [d.reason for d in dropped]
        out.requeued = requeued
        return out
