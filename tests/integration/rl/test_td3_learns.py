"""TD3 learns, in process: the collector the generators run, the replay ring the buffer actor wraps and
:func:`~rlmesh.rl.algorithms.td3.td3_update`, on a continuous task small enough for a test: steer a point
to a target on a line (real gymnasium vector envs, real torch). The recipe end to end is SAC's test
(tests/integration/recipes/test_off_policy_recipes.py); full-size Pendulum figures: benchmarks/algorithms.py."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlmesh.rl.algorithms.configs.off_policy import OffPolicyGeneratorConfig
from rlmesh.rl.algorithms.sac import owed_gradient_steps
from rlmesh.rl.algorithms.td3 import TD3Config, TD3Model, td3_update
from rlmesh.rl.config import ReplayConfig
from rlmesh.rl.replay import TransitionReplayCore, transitions_from_rollout
from rlmesh.rl.rollout import RolloutCollector, evaluate_greedy, greedy_actor


class Reach(gym.Env):
    """A point at ``x`` in [-1, 1] moves by ``0.25 * a`` per step towards a random target; reward ``-|x - target|``,
    20 steps. Staying put scores about -13, a random policy about -12, steering well about -3."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.target, self.t = self.np_random.uniform(-1, 1, 2).tolist() + [0]
        return np.array([self.x, self.target], np.float32), {}

    def step(self, action):
        self.x = float(np.clip(self.x + 0.25 * float(action[0]), -1.0, 1.0))
        self.t += 1
        return np.array([self.x, self.target], np.float32), -abs(self.x - self.target), False, self.t >= 20, {}


gym.register(id="RlmeshTestReach-v0", entry_point=Reach)


@pytest.mark.timeout(300)
def test_td3_learns_to_steer_with_delayed_actor_updates_at_one_gradient_step_per_env_step():
    torch.manual_seed(0)
    env = gym.make("RlmeshTestReach-v0")
    config = TD3Config(hidden_sizes=[32, 32], batch_size=64, gamma=0.9, learning_starts=200)
    model = TD3Model(env.observation_space, env.action_space, config)
    opts = {"actor": torch.optim.Adam(model.actor.parameters(), lr=config.lr),
            "critic": torch.optim.Adam(model.critic.parameters(), lr=config.lr)}
    generator = OffPolicyGeneratorConfig(env_id="RlmeshTestReach-v0", num_envs=2, num_steps=20)
    collector = RolloutCollector(generator, model.actor, seed=0)
    ring = TransitionReplayCore(ReplayConfig(capacity=10_000))
    act = greedy_actor(model.actor, env.action_space)
    untrained, _ = evaluate_greedy(act, "RlmeshTestReach-v0", 20)
    done = 0
    for i in range(40):                                         # 40 rollouts of 2 x 20 steps: 1.5k transitions
        ring.add(f"r{i}", i, transitions_from_rollout(collector.collect(policy_version=i)))
        owed = owed_gradient_steps(collector.total_steps, config.learning_starts, 1, 1, done)
        sample = ring.sample(owed, config.batch_size, config.learning_starts)
        if sample.transitions is not None:
            done += int(td3_update(model, opts, sample.transitions, config, done)["train/gradient_steps"])
        model.actor.random_actions.fill_(collector.total_steps < config.learning_starts)
    collector.close()
    trained, _ = evaluate_greedy(act, "RlmeshTestReach-v0", 20)
    assert done == collector.total_steps - config.learning_starts  # exactly one gradient step per env step
    assert trained > -6.0 and trained > untrained + 4.0, (untrained, trained)
