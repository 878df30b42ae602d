"""gSDE on PPO's Gaussian policy (rlmesh/rl/models/mlp.py, ``trainer.use_sde``), checked by hand: no procs."""

import gymnasium as gym
import pytest
import torch

from rlmesh.errors import ConfigError
from rlmesh.rl.algorithms.ppo import build_policy, ppo_update
from rlmesh.rl.config import GymGeneratorConfig, PPOConfig
from rlmesh.rl.models.mlp import ActorCritic
from rlmesh.rl.rollout import RolloutCollector

PENDULUM = gym.make("Pendulum-v1")
SDE = PPOConfig(use_sde=True, sde_sample_freq=4, sde_log_std_init=-1.0, update_epochs=1, num_minibatches=1)


def test_gsde_settings_travel_with_the_weights_and_the_noise_is_held_for_sde_sample_freq_steps():
    torch.manual_seed(0)
    trainer_side = build_policy(PENDULUM.observation_space, PENDULUM.action_space, None, SDE)
    generator_side = ActorCritic(PENDULUM.observation_space, PENDULUM.action_space)   # knows nothing of the config
    generator_side.load_state_dict(trainer_side.state_dict())
    assert bool(generator_side.use_sde) and int(generator_side.sde_sample_freq) == 4
    obs = torch.randn(3, 3)
    actions = [generator_side.act(obs)[0] for _ in range(8)]
    assert all(torch.equal(actions[0], a) for a in actions[1:4])           # one exploration matrix, 4 steps
    assert not torch.equal(actions[3], actions[4]) and all(torch.equal(actions[4], a) for a in actions[5:8])
    # the std depends on the state: the actor's last hidden features times the matrix's std
    features, _ = trainer_side._features_head(obs)
    std = trainer_side._sde_std(features)
    assert std.shape == (3, 1) and std.std() > 0


def test_gsde_log_probs_of_acting_and_of_evaluating_agree_so_the_first_ppo_ratio_is_one():
    torch.manual_seed(0)
    policy = build_policy(PENDULUM.observation_space, PENDULUM.action_space, None, SDE)
    collector = RolloutCollector(GymGeneratorConfig(env_id="Pendulum-v1", num_envs=2, num_steps=32), policy, seed=0)
    rollout = collector.collect()
    collector.close()
    logp, entropy, _ = policy.evaluate(rollout.obs.reshape(-1, 3), rollout.actions.reshape(-1, 1))
    assert torch.allclose(logp, rollout.logprobs.reshape(-1), atol=1e-5)
    before = policy.sde_log_std.detach().clone()
    metrics = ppo_update(policy, torch.optim.Adam(policy.parameters(), lr=1e-2), rollout, SDE)
    assert metrics["losses/approx_kl"] < 1e-6 and not torch.equal(policy.sde_log_std, before)   # sigma learns


def test_gsde_is_refused_for_discrete_actions_naming_the_key():
    cartpole = gym.make("CartPole-v1")
    with pytest.raises(ConfigError, match=r"trainer\.use_sde=True"):
        build_policy(cartpole.observation_space, cartpole.action_space, None, PPOConfig(use_sde=True))
    with pytest.raises(ConfigError, match=r"trainer\.sde_sample_freq="):
        PPOConfig(sde_sample_freq=0)
