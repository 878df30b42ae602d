"""``GRPOTrainer``: group-relative advantages, the clipped token-level ratio loss and an
optional k3 KL penalty to a frozen reference policy (:mod:`rlmesh.rl.losses.grpo`).

A batch is a list of scored work items from ``LLMGenerator`` (completions from any
backend, their rewards, the group size). Hooks: :meth:`GRPOTrainer.compute_advantages`
(RLOO, REINFORCE... are one override away; see ``examples/rloo_addition.py``) and
:meth:`GRPOTrainer.compute_loss`.
"""

from __future__ import annotations

from typing import Any

import torch

from rlmesh.rl.actors.trainer import Trainer
from rlmesh.rl.backends.torch_backend import build_policy_model
from rlmesh.rl.batching import completions_to_generation
from rlmesh.rl.config import GRPOConfig
from rlmesh.rl.grpo_core import ScoredBatch, frozen_copy, grpo_update, sft_warmstart
from rlmesh.rl.warmup import WarmupPhase
from rlmesh.rl.losses import grpo_advantages, grpo_loss
from rlmesh.rl.models.sampling import sequence_logprobs


class GRPOTrainer(Trainer):
    """GRPO over completions. ``task`` is needed only for the optional SFT warm start.

    Args:
        model_config / model_path: the same model description the generators' backend gets.
        temperature: the generators' sampling temperature (log-probs are taken under it).
        pad_id: padding token of the tokenizer.
    """

    config: GRPOConfig

    def __init__(self, config: GRPOConfig, buffer: Any = None, model_config: Any = None, model_path: str | None = None,
                 task: Any = None, temperature: float = 1.0, pad_id: int = 0, weights: str = "policy",
                 seed: int = 0) -> None:
        self.model_config, self.model_path, self.task = model_config, model_path, task
        self.temperature, self.pad_id = temperature, pad_id
        self.ref_model: torch.nn.Module | None = None
        super().__init__(config, buffer, weights, seed)

    def build_model(self) -> torch.nn.Module:
        return build_policy_model(self.model_config, self.model_path)[0].train()

    def setup(self) -> None:
        """SFT warm start (``trainer.sft_steps``; the task's own ``warm_start`` if it has one), then freeze a reference copy if ``kl_coef > 0``."""
        if self.config.sft_steps:
            if self.task is None:
                raise ValueError("trainer.sft_steps > 0 needs the task (GRPOTrainer(task=...))")
            with WarmupPhase("SFT warm start", total=self.config.sft_steps) as phase:  # its own progress bar
                if hasattr(self.task, "warm_start"):  # a task with its own demonstrations (multi-turn tool episodes)
                    self.task.warm_start(self.model, self.config.sft_steps, lr=self.config.sft_lr, seed=self.seed)
                else:
                    sft_warmstart(self.model, self.task, self.config.sft_steps, lr=self.config.sft_lr, seed=self.seed,
                                  on_step=phase.update)
        if self.config.kl_coef > 0:
            self.ref_model = frozen_copy(self.model)
        self.optimizer = self.build_optimizer()  # fresh Adam moments after the warm start

    def samples_in(self, batch: list[dict[str, Any]]) -> int:
        return sum(len(item["completions"]) for item in batch)

    def checkpoint_extra(self) -> dict[str, Any]:
        """The frozen KL reference (the post-warm-start model): a resumed trainer skips :meth:`setup`."""
        return {"ref_model": self.ref_model.state_dict()} if self.ref_model is not None else {}

    def restore_extra(self, extra: dict[str, Any]) -> None:
        if "ref_model" in extra:
            self.ref_model = frozen_copy(self.model)
            self.ref_model.load_state_dict(extra["ref_model"])

    # -- hooks -------------------------------------------------------------------------------------------------

    def compute_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """Hook: one advantage per completion (flat, groups of ``group_size`` contiguous).

        Runs once per train step, before the loss; ``rewards`` are the reward actor's
        scores. Default: GRPO's group-centred (and, with ``normalize_std``, scaled) rewards.
        """
        return grpo_advantages(rewards, group_size, normalize_std=self.config.normalize_std)

    def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
        """Hook: the token-level loss, with the arguments of :func:`rlmesh.rl.losses.grpo_loss`
        (new log-probs, old log-probs, advantages, mask, then keywords); returns an object
        with ``.loss`` and ``.metrics()``. Runs ``update_epochs`` times per step."""
        return grpo_loss(*args, **kwargs)

    # -- the step ----------------------------------------------------------------------------------------------

    def train_step(self, batch: list[dict[str, Any]]) -> dict[str, float]:
        group_size = batch[0]["group_size"]
        if any(item["group_size"] != group_size for item in batch):
            raise ValueError("GRPOTrainer: every work item of a batch must use the same samples_per_prompt")
        rows = [c for item in batch for c in item["completions"]]
        gen = completions_to_generation(rows, self.pad_id)
        rewards = torch.tensor([r for item in batch for r in item["rewards"]], dtype=torch.float32)
        if not all(item.get("logprobs_exact", True) for item in batch):
            with torch.no_grad():  # the backend's log-probs differ from ours: recompute behaviour log-probs
                gen.completion_logprobs = sequence_logprobs(self.model, gen.input_ids, gen.attention_mask,
                                                            gen.prompt_len, self.temperature) * gen.completion_mask
        scored = ScoredBatch([], gen, rewards, [c.text for c in rows])
        metrics = grpo_update(self.model, self.optimizer, scored, self.config, group_size, self.temperature,
                              ref_model=self.ref_model, max_groups=self.config.max_groups,
                              advantages=self.compute_advantages(rewards, group_size), loss_fn=self.compute_loss)
        metrics["rollout/reward_mean"] = float(rewards.mean())
        return metrics
