"""Pure loss and advantage functions: tensors in, tensors out, unit-tested by hand."""

from rlmesh.rl.losses.advantages import reinforce_advantages, rloo_advantages
from rlmesh.rl.losses.gae import compute_gae
from rlmesh.rl.losses.grpo import GRPOLossOutput, grpo_advantages, grpo_loss, masked_mean
from rlmesh.rl.losses.ppo import PPOLossOutput, ppo_loss

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
