"""A continuous task small enough for a recipe test, importable by a run's procs as
``generator.env_id=reach_env:RlmeshReach-v0`` (the test puts this folder on ``PYTHONPATH``): steer a
point at ``x`` in [-1, 1] towards a random target by ``0.25 * a`` per step, reward ``-|x - target|``,
20 steps. Staying put scores about -13, a random policy about -12, steering well about -3."""

import gymnasium as gym
import numpy as np


class Reach(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.target = self.np_random.uniform(-1, 1, 2).tolist()
        self.t = 0
        return np.array([self.x, self.target], np.float32), {}

    def step(self, action):
        self.x = float(np.clip(self.x + 0.25 * float(action[0]), -1.0, 1.0))
        self.t += 1
        return np.array([self.x, self.target], np.float32), -abs(self.x - self.target), False, self.t >= 20, {}


if "RlmeshReach-v0" not in gym.envs.registry:
    gym.register(id="RlmeshReach-v0", entry_point=Reach)
