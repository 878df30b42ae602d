"""The reference PPO loop on a real gymnasium CartPole vector env."""

import numpy as np
import pytest
import torch

from rlmesh.rl.config import GymGeneratorConfig, PPOConfig
from rlmesh.recipes.compose import compose
from rlmesh.rl.models import ActorCritic
from rlmesh.rl.ppo_core import rollout_advantages, train_ppo
from rlmesh.rl.rollout import RolloutCollector, concat_rollouts, evaluate_greedy, greedy_actor


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    torch.manual_seed(0)


def _collector(num_envs=4, num_steps=200):
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    policy = ActorCritic(env.observation_space, env.action_space)
    return RolloutCollector(GymGeneratorConfig(num_envs=num_envs, num_steps=num_steps), policy, seed=0)


def test_rollout_masks_the_autoreset_step_after_every_episode_end():
    c = _collector()
    r = c.collect(policy_version=7)
    assert r.obs.shape == (200, 4, 4) and r.actions.shape == (200, 4) and r.policy_version == 7
    dones = r.dones.bool()
    assert dones.any(), "a random CartPole policy ends episodes within 200 steps"
    # exactly the step after a done is invalid, and it carries no reward
    expected_invalid = torch.zeros_like(dones)
    expected_invalid[1:] = dones[:-1]
    assert torch.equal(~r.valid, expected_invalid)
    assert (r.rewards[~r.valid] == 0).all()
    # CartPole pays 1 per real step: completed episode returns equal their lengths, and
    # every real step is counted once
    assert r.episode_returns == [float(n) for n in r.episode_lengths]
    assert r.num_steps == int(r.valid.sum()) == c.total_steps
    assert sum(r.episode_lengths) <= r.num_steps


def test_episodes_carry_over_between_rollouts():
    c = _collector(num_envs=1, num_steps=5)
    lengths = []
    for _ in range(40):
        lengths += c.collect().episode_lengths
    assert lengths and max(lengths) > 5  # an episode longer than one rollout was stitched together


def test_advantages_bootstrap_from_the_next_step_value_and_stop_at_terminals():
    c = _collector(num_envs=2, num_steps=100)
    r = c.collect()
    adv, ret = rollout_advantages(r, gamma=0.9, gae_lambda=0.0)  # lambda 0: one-step TD errors
    next_v = torch.cat([r.values[1:], r.last_value[None]])
    td = r.rewards + 0.9 * next_v * (1 - r.terminated) - r.values
    torch.testing.assert_close(adv, td)
    term = r.terminated.bool()
    torch.testing.assert_close(ret[term], r.rewards[term])  # nothing after a terminal state


def test_greedy_eval_of_a_scripted_controller():
    # a hand-made balance controller (push towards the pole's lean) solves CartPole
    mean, returns = evaluate_greedy(lambda obs: (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64), "CartPole-v1", 8)
    assert len(returns) == 8 and mean > 300
    mean_left, _ = evaluate_greedy(lambda obs: np.zeros(len(obs), dtype=np.int64), "CartPole-v1", 4)
    assert mean_left < 20  # always pushing left fails fast


def test_ppo_learns_cartpole_quickly():
    untrained, _ = evaluate_greedy(greedy_actor(_collector().policy), "CartPole-v1", 10)
    assert untrained < 100
    recipe, _ = compose(["recipe=ppo_cartpole"])
    recipe.trainer.total_steps = 30_000
    result = train_ppo(recipe.generator, recipe.trainer, seed=1, eval_every=2048, eval_episodes=10, target_return=450)
    assert result.solved_steps is not None and result.solved_steps <= 30_000, result.evals
    assert result.evals[-1][2] >= 450 and result.solved_seconds <= result.solved_seconds_total
    assert greedy_actor(result.policy)(np.zeros((3, 4), dtype=np.float32)).shape == (3,)


def test_continuous_actions_collect_and_update():
    from rlmesh.rl.ppo_core import make_optimizer, ppo_update

    import gymnasium as gym

    env = gym.make("Pendulum-v1")
    policy = ActorCritic(env.observation_space, env.action_space)
    c = RolloutCollector(GymGeneratorConfig(env_id="Pendulum-v1", num_envs=2, num_steps=16), policy, seed=0)
    r = c.collect()
    assert r.actions.shape == (16, 2, 1) and r.actions.dtype == torch.float32
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = ppo_update(policy, make_optimizer(policy, PPOConfig()), r, PPOConfig(update_epochs=2))
    assert metrics["train/minibatch_updates"] == 8 and np.isfinite(metrics["losses/loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_rollouts_from_replicas_concatenate_along_the_env_axis():
    a, b = _collector(num_envs=2, num_steps=50), _collector(num_envs=3, num_steps=50)
    ra, rb = a.collect(policy_version=4), b.collect(policy_version=3)
    joined = concat_rollouts([ra, rb])
    assert joined.obs.shape == (50, 5, 4) and joined.last_value.shape == (5,)
    assert joined.num_steps == ra.num_steps + rb.num_steps and joined.policy_version == 3
    assert len(joined.episode_returns) == len(ra.episode_returns) + len(rb.episode_returns)
    adv, _ = rollout_advantages(joined, 0.99, 0.95)
    torch.testing.assert_close(adv[:, :2], rollout_advantages(ra, 0.99, 0.95)[0])
    with pytest.raises(ValueError, match="different num_steps"):
        concat_rollouts([ra, _collector(num_envs=1, num_steps=10).collect()])
