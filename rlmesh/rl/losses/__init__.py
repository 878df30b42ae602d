"""Pure loss and advantage functions: tensors in, tensors out, unit-tested by hand.

PPO's (GAE, the clipped loss) live with the rest of PPO in :mod:`rlmesh.rl.algorithms.ppo`
and are re-exported here."""

from rlmesh.rl.algorithms.ppo import PPOLossOutput, compute_gae, ppo_loss
from rlmesh.rl.losses.advantages import reinforce_advantages, rloo_advantages
from rlmesh.rl.losses.grpo import GRPOLossOutput, grpo_advantages, grpo_loss, masked_mean

__all__ = [
    "GRPOLossOutput",
    "PPOLossOutput",
    "compute_gae",
    "grpo_advantages",
    "grpo_loss",
    "masked_mean",
    "ppo_loss",
    "reinforce_advantages",
    "rloo_advantages",
]
