"""One module per algorithm, its mathematics top to bottom (advantages, loss, update) as pure
tensor functions, then its config dataclass and its trainer actor:

- :mod:`~rlmesh.rl.algorithms.ppo`: PPO, discrete and Gaussian actions, observation/reward normalisation
- :mod:`~rlmesh.rl.algorithms.a2c`: A2C, PPO's update with one epoch, one minibatch and no ratio
- :mod:`~rlmesh.rl.algorithms.dqn`: DQN, off-policy, from a transition replay buffer with a target network
- :mod:`~rlmesh.rl.algorithms.sac`: SAC, off-policy continuous control: squashed Gaussian, twin critics, tuned entropy
- :mod:`~rlmesh.rl.algorithms.td3`: TD3, SAC's replay trainer with a deterministic actor, smoothed targets, delayed updates
- :mod:`~rlmesh.rl.algorithms.grpo`: GRPO, group-relative advantages and a clipped token-level loss
- :mod:`~rlmesh.rl.algorithms.rloo`: RLOO, GRPO with a leave-one-out baseline
- :mod:`~rlmesh.rl.algorithms.dapo`: DAPO, GRPO with clip-higher, token-level loss and dynamic sampling

Nothing is imported here: importing one algorithm loads only what it needs.
"""
