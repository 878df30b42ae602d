"""The pure pieces of SAC and TD3 (rlmesh/rl/algorithms/sac.py, td3.py), checked by hand: no procs."""

import copy
import math
import uuid

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlmesh.errors import ConfigError
from rlmesh.rl.algorithms.configs.off_policy import OffPolicyGeneratorConfig
from rlmesh.rl.algorithms.sac import (SACConfig, SACModel, SACTrainer, SquashedGaussianActor, annealed_lr,
                                      entropy_coef_loss, owed_gradient_steps, sac_update, squashed_log_prob,
                                      to_env_bounds)
from rlmesh.rl.algorithms.td3 import TD3Config, TD3Model, smoothed_target_actions, td3_update
from rlmesh.rl.replay import NewRollout, ReplaySample, Transitions

PENDULUM = gym.make("Pendulum-v1")
OBS, ACT = PENDULUM.observation_space, PENDULUM.action_space          # 3 observations, 1 action in [-2, 2]


def _batch(n: int) -> Transitions:
    return Transitions(torch.randn(n, 3), torch.rand(n, 1) * 2 - 1, -torch.rand(n), torch.randn(n, 3), torch.zeros(n))


def test_squashed_log_prob_is_the_change_of_variables_and_is_capped_where_tanh_saturates():
    mean, std = torch.tensor([[0.3, -1.0]]), torch.tensor([[0.5, 2.0]])
    u = torch.tensor([[0.7, -2.5]])
    squashed = torch.distributions.TransformedDistribution(torch.distributions.Normal(mean, std),
                                                           [torch.distributions.TanhTransform()])
    assert torch.allclose(squashed_log_prob(u, mean, std), squashed.log_prob(torch.tanh(u)).sum(-1), atol=1e-4)
    far = squashed_log_prob(torch.tensor([[30.0, -30.0]]), mean, std)   # tanh(u) rounds to +-1 here
    gaussian = torch.distributions.Normal(mean, std).log_prob(torch.tensor([[30.0, -30.0]])).sum(-1)
    assert torch.isfinite(far).all()
    assert torch.allclose(far - gaussian, torch.tensor(-2 * math.log(1e-6)))   # capped at -log(eps) per dimension


def test_actions_live_in_minus_one_one_and_are_rescaled_to_the_env_bounds():
    assert np.allclose(to_env_bounds(np.array([-1.0, 0.0, 1.0]), np.array(-2.0), np.array(2.0)), [-2.0, 0.0, 2.0])
    assert np.allclose(to_env_bounds(np.array([[0.0, 1.0]]), np.array([0.0, -1.0]), np.array([4.0, 3.0])), [[2.0, 3.0]])
    actor = SquashedGaussianActor(OBS, ACT, [16])
    obs = torch.randn(500, 3) * 5
    for random in (True, False):                        # the uniform warm-up, then the squashed Gaussian
        actor.random_actions.fill_(random)
        a = actor.act(obs)[0]
        assert a.shape == (500, 1) and a.abs().max() <= 1.0
        env_a = actor.env_actions(a)
        assert env_a.min() >= -2.0 and env_a.max() <= 2.0
    assert torch.equal(actor.act(obs, greedy=True)[0], actor.act(obs, greedy=True)[0])
    with pytest.raises(TypeError, match="trainer=dqn"):
        SquashedGaussianActor(OBS, gym.spaces.Discrete(3), [16])
    with pytest.raises(ValueError, match="finite"):
        SquashedGaussianActor(OBS, gym.spaces.Box(-np.inf, np.inf, (1,)), [16])


def test_the_warm_up_switch_and_observation_statistics_travel_with_the_actor_weights():
    trainer_side, generator_side = SquashedGaussianActor(OBS, ACT, [16]), SquashedGaussianActor(OBS, ACT, [16])
    trainer_side.random_actions.fill_(False)
    trainer_side.obs_rms.update(torch.randn(64, 3) * 3 + 1)
    generator_side.load_state_dict(trainer_side.state_dict())
    obs = torch.randn(8, 3)
    assert not bool(generator_side.random_actions)
    assert torch.equal(generator_side.act(obs, greedy=True)[0], trainer_side.act(obs, greedy=True)[0])


def test_gsde_holds_its_exploration_matrix_for_sde_sample_freq_steps_and_its_std_depends_on_the_state():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(OBS, ACT, [16], use_sde=True, log_std_init=-1.0, sde_sample_freq=3)
    actor.random_actions.fill_(False)
    obs = torch.randn(2, 3)
    actions = [actor.act(obs)[0] for _ in range(6)]
    assert torch.equal(actions[0], actions[1]) and torch.equal(actions[1], actions[2])   # the same W three steps
    assert not torch.equal(actions[2], actions[3]) and torch.equal(actions[3], actions[5])
    mean, std, features = actor.distribution(torch.randn(4, 3))
    assert torch.allclose(std, torch.sqrt(features.pow(2) @ actor.sde_log_std.exp().pow(2) + 1e-6))
    assert std.std() > 0                                                                   # one std per state
    a, logp = actor.sample(torch.randn(4, 3))
    logp.sum().backward()                                                                  # sigma learns from it
    assert actor.sde_log_std.grad is not None and actor.sde_log_std.grad.abs().sum() > 0


def test_entropy_tuning_raises_alpha_while_the_entropy_is_below_target_and_lowers_it_above():
    for logp, direction in ((torch.full((8,), 2.0), +1), (torch.full((8,), -3.0), -1)):   # entropy -2, then 3
        log_alpha = torch.zeros((), requires_grad=True)
        opt = torch.optim.SGD([log_alpha], lr=0.1)
        entropy_coef_loss(log_alpha, logp, target_entropy=-1.0).backward()
        opt.step()
        assert torch.sign(log_alpha.detach()) == direction


def test_sac_update_moves_every_part_and_the_target_critics_by_polyak_averaging():
    torch.manual_seed(0)
    config = SACConfig(hidden_sizes=[16, 16], batch_size=32, tau=0.25)
    model = SACModel(OBS, ACT, config)
    opts = {"actor": torch.optim.Adam(model.actor.parameters(), 1e-2),
            "critic": torch.optim.Adam(model.critic.parameters(), 1e-2),
            "alpha": torch.optim.Adam([model.log_alpha], 1e-2)}
    before = copy.deepcopy(model)
    metrics = sac_update(model, opts, _batch(32), config)        # one minibatch: one gradient step
    assert metrics["train/gradient_steps"] == 1 and metrics["losses/alpha"] != 1.0
    changed = lambda a, b: any(not torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))  # noqa: E731
    assert changed(model.actor, before.actor) and changed(model.critic, before.critic)
    for t, t0, c in zip(model.critic_target.parameters(), before.critic_target.parameters(),
                        model.critic.parameters()):
        assert torch.allclose(t, 0.75 * t0 + 0.25 * c, atol=1e-6)
    assert model.target_entropy == -1.0                          # -|A| for Pendulum's one action


def test_td3_smooths_target_actions_within_the_clip_and_delays_the_actor_and_targets():
    target = torch.tensor([[0.9], [-0.2], [0.0]]).repeat(100, 1)
    smoothed = smoothed_target_actions(target, noise_std=10.0, noise_clip=0.5)
    assert (smoothed - target).abs().max() <= 0.5 + 1e-6 and smoothed.abs().max() <= 1.0
    assert smoothed.max() == 1.0                                  # 0.9 + up to 0.5, clipped into the bounds
    assert torch.equal(smoothed_target_actions(target, 0.0, 0.5), target)

    torch.manual_seed(0)
    config = TD3Config(hidden_sizes=[16, 16], batch_size=32, policy_delay=2)
    model = TD3Model(OBS, ACT, config)
    opts = {"actor": torch.optim.Adam(model.actor.parameters(), 1e-2),
            "critic": torch.optim.Adam(model.critic.parameters(), 1e-2)}
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))  # noqa: E731
    before = copy.deepcopy(model)
    metrics = td3_update(model, opts, _batch(32), config, gradient_steps_done=0)   # gradient step 1 of 2
    assert "losses/actor_loss" not in metrics and not same(model.critic, before.critic)
    assert same(model.actor, before.actor) and same(model.actor_target, before.actor_target)
    assert same(model.critic_target, before.critic_target)
    td3_update(model, opts, _batch(32), config, gradient_steps_done=1)             # step 2: the delayed one
    assert not same(model.actor, before.actor) and not same(model.actor_target, before.actor_target)
    assert not same(model.critic_target, before.critic_target)
    model.actor.random_actions.fill_(False)
    obs = torch.randn(1000, 3)
    noise = model.actor.act(obs)[0] - model.actor.act(obs, greedy=True)[0]
    assert 0.07 < float(noise[noise.abs() < 0.99].std()) < 0.13   # exploration_noise 0.1 (away from the clip)


def test_the_update_to_data_ratio_is_never_exceeded_and_counts_from_learning_starts():
    assert owed_gradient_steps(100, learning_starts=100, gradient_steps=1, train_freq=1, done=0) == 0
    assert owed_gradient_steps(164, 100, 1, 1, done=0) == 64
    assert owed_gradient_steps(164, 100, 1, 1, done=64) == 0
    assert owed_gradient_steps(180, 100, 1, 1, done=70) == 10                  # a short rollout, then catching up
    assert owed_gradient_steps(110, 0, gradient_steps=1, train_freq=4, done=0) == 27   # one step per 4 env steps
    assert owed_gradient_steps(110, 0, gradient_steps=2, train_freq=1, done=0) == 220
    done = 0
    for collected in range(0, 5000, 37):                                       # any arrival pattern
        done += owed_gradient_steps(collected, 200, 3, 2, done)
        assert done <= max(0, collected - 200) * 3 / 2


def test_off_policy_configs_name_the_key_to_fix():
    for cls, key, bad in ((SACConfig, "tau", 0.0), (SACConfig, "gradient_steps", 0), (SACConfig, "train_freq", 0),
                          (SACConfig, "ent_coef", -0.1), (SACConfig, "hidden_sizes", []),
                          (TD3Config, "policy_delay", 0), (TD3Config, "target_noise_clip", -1.0),
                          (TD3Config, "use_sde", True)):
        with pytest.raises(ConfigError, match=rf"trainer\.{key}="):
            cls(**{key: bad})
    with pytest.raises(ConfigError, match=r"generator\.sde_sample_freq="):
        OffPolicyGeneratorConfig(env_id="Pendulum-v1", sde_sample_freq=0)
    assert SACConfig().rollouts_per_train(replicas=4) == 1        # update after every rollout that lands


def test_observation_normalisation_lives_in_the_actor_and_td3s_target_actor_follows_it():
    torch.manual_seed(0)
    config = TD3Config(hidden_sizes=[16, 16], batch_size=32, normalize_obs=True)
    model = TD3Model(OBS, ACT, config)
    opts = {"actor": torch.optim.Adam(model.actor.parameters(), 1e-2),
            "critic": torch.optim.Adam(model.critic.parameters(), 1e-2)}
    model.actor.obs_rms.update(torch.randn(256, 3) * 8 + 3)         # what OffPolicyTrainer.train_step merges
    metrics = td3_update(model, opts, _batch(64), config, gradient_steps_done=1)
    assert all(np.isfinite(v) for v in metrics.values())
    assert torch.equal(model.actor_target.obs_rms.mean, model.actor.obs_rms.mean)   # one set of statistics
    generator_side = SquashedGaussianActor(OBS, ACT, [16])
    sac = SACModel(OBS, ACT, SACConfig(hidden_sizes=[16], normalize_obs=True))
    sac.actor.obs_rms.update(torch.randn(256, 3) * 8 + 3)
    generator_side.load_state_dict(sac.actor.state_dict())           # the statistics travel with the weights
    assert bool(generator_side.obs_rms.enabled) and torch.equal(generator_side.obs_rms.var, sac.actor.obs_rms.var)


def test_anneal_lr_decays_every_optimiser_linearly_to_zero_over_the_env_step_budget():
    # SB3's lin_<lr>: lr x (1 - collected / total_steps), set when a train call starts
    assert annealed_lr(1e-3, 0, 1000) == 1e-3 and annealed_lr(1e-3, 1500, 1000) == 0.0
    cfg = SACConfig(hidden_sizes=[16, 16], batch_size=32, total_steps=1000, lr=1e-3, anneal_lr=True, learning_starts=0)
    trainer = SACTrainer(cfg, "Pendulum-v1", weights=f"anneal-{uuid.uuid4().hex[:6]}")
    try:
        assert set(trainer.opts) == {"actor", "critic", "alpha"}
        for step, collected in enumerate((250, 500, 750)):
            out = trainer.learn(ReplaySample([NewRollout(f"r{step}", 0, 250)], _batch(32), collected))
            want = 1e-3 * (1 - collected / 1000)
            assert out.metrics["train/lr"] == pytest.approx(want)
            assert all(g["lr"] == pytest.approx(want) for o in trainer.opts.values() for g in o.param_groups)
    finally:
        trainer.publisher.close()
    assert SACConfig().anneal_lr is False and TD3Config().anneal_lr is False  # constant unless a preset says lin_
