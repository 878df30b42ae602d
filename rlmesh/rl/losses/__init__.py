"""Pure loss and advantage functions: tensors in, tensors out, unit-tested by hand.

PPO's (GAE, the clipped loss) live with the rest of PPO in :mod:`rlmesh.rl.algorithms.ppo`
(import them from there)."""

from rlmesh.rl.losses.advantages import reinforce_advantages, rloo_advantages
from rlmesh.rl.losses.grpo import GRPOLossOutput, grpo_advantages, grpo_loss, masked_mean

__all__ = [
    "GRPOLossOutput",
    "grpo_advantages",
    "grpo_loss",
    "masked_mean",
    "reinforce_advantages",
    "rloo_advantages",
]
