"""Pure loss and advantage functions: tensors in, tensors out, unit-tested by hand.

Each algorithm's own maths lives in its module under :mod:`rlmesh.rl.algorithms` (PPO's GAE and
clipped loss in ``ppo``, GRPO's advantages and loss in ``grpo``); here are what several share: the
loss result type and the baselines that replace GRPO's group mean (RLOO, REINFORCE)."""

from rlmesh.rl.losses.advantages import reinforce_advantages, rloo_advantages

__all__ = [
    "reinforce_advantages",
    "rloo_advantages",
]
