"""``PPOTrainer``: GAE, the clipped surrogate, value loss and entropy bonus
(:func:`rlmesh.rl.algorithms.ppo.ppo_update`, the same code as the single-process reference).

Hooks for new algorithms: :meth:`PPOTrainer.compute_advantages` and :meth:`PPOTrainer.compute_loss`.
"""

from __future__ import annotations

from typing import Any

import torch

from rlmesh.rl.actors.gym_generator import env_spaces
from rlmesh.rl.actors.trainer import Trainer
from rlmesh.rl.config import PPOConfig
from rlmesh.rl.models.mlp import ActorCritic, ActorCriticConfig
from rlmesh.rl.algorithms.ppo import make_optimizer, ppo_loss, ppo_update, rollout_advantages
from rlmesh.rl.rollout import Rollout, concat_rollouts


class PPOTrainer(Trainer):
    """PPO on batches of :class:`~rlmesh.rl.rollout.Rollout` (one per generator work item).

    Learning rate and clip decay linearly over ``config.total_steps`` *trained* env steps
    when ``anneal_lr`` / ``anneal_clip`` are set.
    """

    config: PPOConfig

    def __init__(self, config: PPOConfig, env_id: str, buffer: Any = None, model: ActorCriticConfig | None = None,
                 weights: str = "policy", seed: int = 0) -> None:
        self.env_id, self.model_config = env_id, model
        self._shuffle = torch.Generator().manual_seed(seed)
        super().__init__(config, buffer, weights, seed)

    def build_model(self) -> torch.nn.Module:
        obs_space, act_space = env_spaces(self.env_id)
        return ActorCritic(obs_space, act_space, self.model_config)

    def build_optimizer(self) -> torch.optim.Optimizer:
        return make_optimizer(self.model, self.config)

    def samples_in(self, batch: list[Rollout]) -> int:
        return sum(r.num_steps for r in batch)

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"shuffle_rng": self._shuffle.get_state()}

    def restore_extra(self, extra: dict[str, Any]) -> None:
        if "shuffle_rng" in extra:
            self._shuffle.set_state(extra["shuffle_rng"])

    def progress_left(self) -> float:
        """Fraction of the env-step budget not yet trained on (1 -> 0): the annealing factor."""
        return max(0.0, 1.0 - self.samples_seen / self.config.total_steps)

    # -- hooks -------------------------------------------------------------------------------------------------

    def compute_advantages(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """Hook: ``(advantages, returns)``, each ``[T, N]``, for one concatenated batch.

        Runs once per train step under ``torch.no_grad()``, before any minibatch; may
        assume ``rollout.values`` / ``last_value`` came from the behaviour policy.
        Default: GAE(gamma, lambda) with the truncation bootstrap.
        """
        return rollout_advantages(rollout, self.config.gamma, self.config.gae_lambda)

    def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
        """Hook: the minibatch loss, called once per minibatch with the arguments of
        :func:`rlmesh.rl.algorithms.ppo.ppo_loss` (new log-probs, old log-probs, advantages, values,
        old values, returns, entropy, then the coefficients as keywords); must return an
        object with ``.loss`` (to backpropagate), ``.approx_kl`` and ``.metrics()``."""
        return ppo_loss(*args, **kwargs)

    # -- the step ----------------------------------------------------------------------------------------------

    def train_step(self, batch: list[Rollout]) -> dict[str, float]:
        rollout = concat_rollouts(batch) if len(batch) > 1 else batch[0]
        frac = self.progress_left()
        if self.config.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = self.config.lr * frac
        clip = self.config.clip_coef * frac if self.config.anneal_clip else None
        metrics = ppo_update(self.model, self.optimizer, rollout, self.config, clip, self._shuffle,
                             advantages_fn=self.compute_advantages, loss_fn=self.compute_loss)
        if rollout.episode_returns:
            metrics["charts/episodic_return"] = sum(rollout.episode_returns) / len(rollout.episode_returns)
        return metrics
