"""The RL layer: losses, models, tasks, replay-buffer logic and configs.

Everything in this package below the actor classes is pure: tensors in, tensors out,
no sockets and no runtime. The actors (``GymGenerator``, ``PPOTrainer``, ...) wrap these
building blocks, so what is unit-tested here is exactly what runs distributed.

Submodules are imported explicitly (``from rlmesh.rl.losses import ppo_loss``) so that
``import rlmesh.rl`` stays cheap and does not pull in gymnasium or transformers.
"""
