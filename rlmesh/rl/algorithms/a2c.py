"""A2C (Mnih et al., 2016, synchronous form), top to bottom: advantages, loss, update.

A2C is the on-policy actor-critic PPO grew out of. On a rollout of ``num_envs x num_steps``:

1. **Advantages**: GAE(gamma, lambda), the same :func:`~rlmesh.rl.algorithms.ppo.compute_gae`
   as PPO (``gae_lambda=1`` gives the n-step returns of the original paper).
2. **Loss** (:func:`a2c_loss`): ``-mean(A * log pi(a|s)) + c_v * mean((V - R)^2) - c_e * H``:
   the plain policy gradient, no ratio and no clip, since the data was collected by the very
   weights being updated.
3. **Update**: *one* gradient step on the whole rollout (no epochs, no minibatches), RMSprop as
   in the paper and SB3, gradient-norm clipping.

So A2C is PPO's update (:func:`~rlmesh.rl.algorithms.ppo.ppo_update`) with ``update_epochs=1``,
``num_minibatches=1`` and this loss, and :class:`A2CTrainer` is :class:`PPOTrainer` with two hooks
overridden (``compute_loss``, ``build_optimizer``). Everything else (rollouts, normalisation,
annealing, checkpoints) is PPO's.
"""

from __future__ import annotations

from typing import Any

import torch

from rlmesh.rl.algorithms.configs import A2CConfig
from rlmesh.rl.algorithms.ppo import PPOLossOutput, PPOTrainer


def a2c_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    clip_coef: float = 0.2,
    value_clip_coef: float | None = None,
    value_coef: float = 0.5,
    entropy_coef: float = 0.0,
    normalize_advantages: bool = False,
) -> PPOLossOutput:
    """Advantage actor-critic loss over a flat batch (every argument ``[B]``).

    The signature and result of :func:`~rlmesh.rl.algorithms.ppo.ppo_loss`, so it drops into the same
    update; ``old_logprobs``, ``old_values``, ``clip_coef`` and ``value_clip_coef`` are unused (A2C never
    reuses data, so there is no ratio to clip), and ``approx_kl`` / ``clip_fraction`` are 0.
    The value loss is the plain mean squared error, as in SB3's A2C.
    """
    del old_logprobs, old_values, clip_coef, value_clip_coef
    if normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = -(advantages.detach() * new_logprobs).mean()
    value_loss = (returns - new_values).pow(2).mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy_mean
    zero = torch.zeros(())
    return PPOLossOutput(loss, policy_loss, value_loss, entropy_mean, zero, zero)


class A2CTrainer(PPOTrainer):
    """PPO's trainer with A2C's loss and optimiser: two hooks."""

    config: A2CConfig

    def build_optimizer(self) -> torch.optim.Optimizer:
        if self.config.optimizer == "adam":
            return super().build_optimizer()
        return torch.optim.RMSprop(self.model.parameters(), lr=self.config.lr, alpha=self.config.rmsprop_alpha,
                                   eps=self.config.adam_eps)

    def compute_loss(self, *args: Any, **kwargs: Any) -> PPOLossOutput:
        return a2c_loss(*args, **kwargs)
