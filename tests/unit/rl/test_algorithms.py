"""The pure maths of the algorithm modules (rlmesh/rl/algorithms/), checked by hand: no procs."""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlmesh.errors import ConfigError
from rlmesh.rl.algorithms.a2c import A2CConfig, a2c_loss
from rlmesh.rl.algorithms.dapo import DAPOConfig, count_informative, informative_groups
from rlmesh.rl.algorithms.dqn import DQNConfig, QNetwork, dqn_update, linear_epsilon, soft_update, td_targets
from rlmesh.rl.algorithms.ppo import build_policy, discounted_returns, ppo_loss, ppo_update, scale_rewards
from rlmesh.rl.algorithms.rloo import RLOOConfig, scaled_rloo_advantages
from rlmesh.rl.config import GRPOConfig, GymGeneratorConfig, PPOConfig
from rlmesh.rl.algorithms.grpo import grpo_advantages, grpo_loss
from rlmesh.rl.models.mlp import ActorCritic
from rlmesh.rl.models.normalize import RunningMeanStd
from rlmesh.rl.replay import ReplayConfig, Transitions, TransitionReplayCore, transitions_from_rollout
from rlmesh.rl.rollout import RolloutCollector

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def test_running_mean_std_merges_batches_like_one_batch_and_is_off_until_updated():
    x = torch.randn(1000, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -1.0, 0.0])
    rms = RunningMeanStd((3,))
    assert torch.equal(rms.normalize(x), x)                      # disabled: identity
    for part in x.split([1, 99, 400, 500]):
        rms.update(part)
    assert torch.allclose(rms.mean, x.mean(0), atol=1e-4)
    assert torch.allclose(rms.var, x.var(0, unbiased=False), rtol=1e-3)
    z = rms.normalize(x)
    assert torch.allclose(z.mean(0), torch.zeros(3), atol=1e-3) and torch.allclose(z.std(0), torch.ones(3), atol=1e-2)


def test_observation_statistics_travel_with_the_state_dict():
    trainer_side = ActorCritic(BOX, gym.spaces.Discrete(2))
    trainer_side.obs_rms.update(torch.randn(64, 3) * 4 + 1)
    generator_side = ActorCritic(BOX, gym.spaces.Discrete(2))   # built with defaults, knows nothing
    obs = torch.randn(5, 3)
    assert not torch.allclose(generator_side.value(obs), trainer_side.value(obs))
    generator_side.load_state_dict(trainer_side.state_dict())
    assert torch.allclose(generator_side.value(obs), trainer_side.value(obs))
    assert bool(generator_side.obs_rms.enabled)


def test_discounted_returns_reset_at_episode_ends():
    r = torch.tensor([[1.0], [1.0], [1.0], [1.0]])
    d = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    assert torch.allclose(discounted_returns(r, d, 0.5), torch.tensor([[1.0], [1.5], [1.0], [1.5]]))


def _rollout(env_id="CartPole-v1", steps=16, envs=2, policy=None):
    env = gym.make(env_id)
    policy = policy or ActorCritic(env.observation_space, env.action_space)
    collector = RolloutCollector(GymGeneratorConfig(env_id=env_id, num_envs=envs, num_steps=steps), policy, seed=0)
    try:
        return collector.collect(), policy
    finally:
        collector.close()


def test_ppo_update_with_normalisation_scales_rewards_and_updates_obs_statistics_after_the_update():
    rollout, policy = _rollout("Pendulum-v1", steps=32)
    config = PPOConfig(normalize_obs=True, normalize_reward=True, update_epochs=1, num_minibatches=1)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    metrics = ppo_update(policy, opt, rollout, config)
    assert metrics["losses/approx_kl"] < 1e-6                   # one epoch, one minibatch: ratio exactly 1
    assert bool(policy.obs_rms.enabled) and float(policy.obs_rms.count) == pytest.approx(64, abs=1e-3)
    assert torch.allclose(policy.obs_rms.mean, rollout.obs.reshape(-1, 3).mean(0), atol=1e-3)
    scaled = scale_rewards(policy, rollout, 0.99)               # Pendulum's rewards are ~-1..-16: scaled down
    assert scaled.abs().max() < rollout.rewards.abs().max()


def test_a2c_loss_has_the_policy_gradient_of_ppo_at_ratio_one():
    torch.manual_seed(0)
    logits = torch.randn(8, requires_grad=True)
    adv, values, returns, ent = torch.randn(8), torch.randn(8), torch.randn(8), torch.rand(8)
    grads = []
    for fn in (a2c_loss, ppo_loss):
        logits.grad = None
        fn(logits, logits.detach(), adv, values, values, returns, ent, normalize_advantages=False).policy_loss.backward()
        grads.append(logits.grad.clone())
    assert torch.allclose(grads[0], grads[1])


def test_a2c_config_refuses_epochs_and_minibatches():
    with pytest.raises(ConfigError, match="trainer.update_epochs"):
        A2CConfig(update_epochs=4)
    with pytest.raises(ConfigError, match="trainer.num_minibatches"):
        A2CConfig(num_minibatches=4)


def test_transitions_from_rollout_pair_each_state_with_its_true_successor():
    rollout, _ = _rollout(steps=40, envs=2)
    t = transitions_from_rollout(rollout)
    assert len(t) == rollout.num_steps
    # every non-final transition's next_obs is the next row's obs; the autoreset rows are gone
    obs, valid = rollout.obs, rollout.valid
    for n in range(2):
        rows = [s for s in range(40) if valid[s, n]]
        for s in rows:
            nxt = obs[s + 1, n] if s + 1 < 40 else rollout.last_obs[n]
            i = int(valid[:s, :].sum() + valid[s, :n].sum())  # time-major position of (s, n)
            assert torch.equal(t.obs[i], obs[s, n]) and torch.equal(t.next_obs[i], nxt)


def test_transition_ring_overwrites_the_oldest_refuses_duplicates_and_waits_for_learning_starts():
    core = TransitionReplayCore(ReplayConfig(capacity=5))
    batch = lambda v, n: Transitions(torch.full((n, 2), v), torch.zeros(n), torch.full((n,), v), torch.zeros(n, 2),  # noqa: E731
                                     torch.zeros(n))
    assert core.add("a", 0, batch(1.0, 3)) == "" and core.add("a", 0, batch(1.0, 3)) == "duplicate"
    early = core.sample(2, 4, learning_starts=4)
    assert early.transitions is None and [r.rollout_id for r in early.new] == ["a"]   # 3 < learning_starts
    core.add("b", 1, batch(2.0, 4))
    assert len(core) == 5
    s = core.sample(3, 4, learning_starts=4, generator=torch.Generator().manual_seed(0))
    assert [r.rollout_id for r in s.new] == ["b"] and s.new_samples == 4 and len(s.transitions) == 12
    assert set(s.transitions.rewards.tolist()) <= {1.0, 2.0}
    assert float((core._data.rewards == 1.0).sum()) == 1                  # 2 of "a"'s 3 rows overwritten
    assert core.sample(1, 1).new == []                                    # the new-rollout log was handed over


def test_td_targets_bootstrap_unless_terminated():
    net = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.eye(2))
    batch = Transitions(torch.zeros(2, 2), torch.zeros(2), torch.tensor([1.0, 1.0]),
                        torch.tensor([[3.0, 5.0], [3.0, 5.0]]), torch.tensor([0.0, 1.0]))
    assert torch.allclose(td_targets(net, batch, 0.9), torch.tensor([1.0 + 0.9 * 5.0, 1.0]))


def test_soft_update_and_epsilon_schedule():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    target = copy.deepcopy(a)
    soft_update(target, b, 0.25)
    assert torch.allclose(target.weight, 0.75 * a.weight + 0.25 * b.weight)
    assert linear_epsilon(0, 1000, 0.1, 1.0, 0.05) == 1.0
    assert linear_epsilon(50, 1000, 0.1, 1.0, 0.05) == pytest.approx(0.525)
    assert linear_epsilon(5000, 1000, 0.1, 1.0, 0.05) == 0.05


def test_dqn_update_fits_q_to_the_td_targets_and_the_network_explores_by_its_epsilon_buffer():
    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    q = QNetwork(env.observation_space, env.action_space)
    target = copy.deepcopy(q)
    n = 256
    batch = Transitions(torch.randn(n, 4), torch.randint(2, (n,)), torch.ones(n), torch.randn(n, 4), torch.ones(n))
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    config = DQNConfig(batch_size=64, target_update_every=1000)
    first = dqn_update(q, target, opt, batch, config)["losses/loss"]
    for _ in range(30):
        last = dqn_update(q, target, opt, batch, config)
    assert last["train/gradient_steps"] == 4 and last["losses/loss"] < 0.1 * first  # all terminal: Q(s,a) -> 1
    obs = torch.randn(500, 4)
    q.epsilon.fill_(0.0)
    assert torch.equal(q.act(obs)[0], q(obs).argmax(-1))
    q.epsilon.fill_(1.0)
    assert 0.3 < float((q.act(obs)[0] == q(obs).argmax(-1)).float().mean()) < 0.7
    assert torch.equal(q.act(obs, greedy=True)[0], q(obs).argmax(-1))
    with pytest.raises(TypeError, match="Discrete"):
        QNetwork(env.observation_space, BOX)


def test_rloo_and_dapo_pieces():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = scaled_rloo_advantages(r, 4)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3])) and torch.equal(adv[4:], torch.zeros(4))
    assert scaled_rloo_advantages(r, 4, scale_by_std=True).std() == pytest.approx(1.0)
    assert informative_groups(r, 4).tolist() == [True, False]
    assert count_informative([{"rewards": r.tolist(), "group_size": 2}]) == 1   # pairs (1,0) (0,0) (1,1) (1,1)
    with pytest.raises(ConfigError, match="trainer.min_std"):
        RLOOConfig(min_std=0)
    with pytest.raises(ConfigError, match="trainer.max_groups"):
        DAPOConfig(max_groups=None)
    assert DAPOConfig().clip_coef_high == 0.28 and DAPOConfig().aggregation == "token_mean"


def test_rloo_loss_hand_values_and_gradient():
    # rewards (1, 0, 0, 0), G=4: leave-one-out advantages (1, -1/3, -1/3, -1/3); on-policy the ratio is 1
    adv = scaled_rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    logp = torch.zeros(4, 2, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])      # 5 completion tokens
    out = grpo_loss(logp, logp.detach(), adv, mask)
    assert out.loss.item() == pytest.approx(-(1 * 2 - 1 / 3 * 3) / 5)          # token_mean of -A * ratio
    out.loss.backward()
    expected = -adv.unsqueeze(1) * mask / 5                                    # d ratio / d logp = ratio = 1
    assert torch.allclose(logp.grad, expected)
    assert out.metrics()["losses/clip_fraction"] == 0.0


def test_dapo_loss_clip_higher_token_mean_hand_values():
    cfg = DAPOConfig()
    # sequence 0: two tokens at ratio 1.4 (A=+1); sequence 1: one at 1.25 (A=+1); sequence 2: one at 0.7 (A=-1)
    ratio = torch.tensor([[1.4, 1.4], [1.25, 1.0], [0.7, 1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    old = torch.zeros(3, 2)
    adv = torch.tensor([1.0, 1.0, -1.0])
    out = grpo_loss(ratio.log(), old, adv, mask, clip_coef=cfg.clip_coef, clip_coef_high=cfg.clip_coef_high,
                    aggregation=cfg.aggregation)
    # per token -min(A r, A clip(r, 0.8, 1.28)): -1.28, -1.28, -1.25 (inside clip-higher), +0.8
    assert out.loss.item() == pytest.approx((-1.28 * 2 - 1.25 + 0.8) / 4)
    symmetric = grpo_loss(ratio.log(), old, adv, mask, clip_coef=0.2, aggregation="token_mean")
    assert symmetric.loss.item() == pytest.approx((-1.2 * 2 - 1.2 + 0.8) / 4)
    # clipped tokens: 1.4, 1.4 and 0.7 are outside [0.8, 1.28]; 1.25 is not (it was counted before the fix)
    assert out.clip_fraction.item() == pytest.approx(3 / 4)
    assert symmetric.clip_fraction.item() == pytest.approx(1.0)
    seq = grpo_loss(ratio.log(), old, adv, mask, clip_coef=0.2, clip_coef_high=0.28, aggregation="sequence_mean")
    assert seq.loss.item() == pytest.approx((-1.28 - 1.25 + 0.8) / 3)


def test_dr_grpo_divides_each_sequence_sum_by_one_constant():
    lp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])        # a long and a short completion
    adv = grpo_advantages(torch.tensor([0.0, 1.0]), 2, normalize_std=False)    # (-0.5, +0.5): no std scaling
    out = grpo_loss(lp, lp.detach(), adv, mask, aggregation="sequence_sum_norm", norm_length=8)
    assert out.loss.item() == pytest.approx(((0.5 * 4) / 8 + (-0.5 * 1) / 8) / 2)
    out.loss.backward()
    assert torch.allclose(lp.grad, -adv.unsqueeze(1) * mask / (8 * 2))       # every token weighs 1/(L G)
    # GRPO's sequence mean gives the short answer's one token 4x the weight of each long-answer token
    lp.grad = None
    grpo_loss(lp, lp.detach(), adv, mask, aggregation="sequence_mean").loss.backward()
    assert lp.grad[1, 0].abs() == 4 * lp.grad[0, 0].abs()
    # without norm_length the constant is the padded width (4 here)
    wide = grpo_loss(lp, lp.detach(), adv, mask, aggregation="sequence_sum_norm")
    assert wide.loss.item() == pytest.approx(((0.5 * 4) / 4 + (-0.5 * 1) / 4) / 2)
    with pytest.raises(ConfigError, match="trainer.norm_length"):
        GRPOConfig(aggregation="sequence_sum_norm", norm_length=0)
    assert GRPOConfig(aggregation="sequence_sum_norm", normalize_std=False).aggregation == "sequence_sum_norm"


def test_tanh_squashed_actions_stay_in_bounds_travel_with_the_weights_and_keep_the_ppo_ratio():
    box = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    trainer_side = build_policy(BOX, box, None, PPOConfig(squash_actions=True))
    u = torch.tensor([[0.0, 0.0], [10.0, -10.0], [-0.5, 0.5]])
    a = trainer_side.env_actions(u)
    assert np.allclose(a[0], [0.0, 0.5]) and np.allclose(a[1], [2.0, 0.0], atol=1e-6)   # centre; saturates at bounds
    assert np.allclose(a[2], [-2 + 2 * (np.tanh(-0.5) + 1), 0.5 * (np.tanh(0.5) + 1)])
    clipping = ActorCritic(BOX, box)                        # built with defaults, as a generator is: clips
    assert np.allclose(clipping.env_actions(u)[1], [2.0, 0.0]) and np.allclose(clipping.env_actions(u)[2], [-0.5, 0.5])
    clipping.load_state_dict(trainer_side.state_dict())    # the publish carries the flag
    assert np.allclose(clipping.env_actions(u)[2], a[2])
    # the rollout stores the pre-squash sample, whose Gaussian log-prob is what the ratio uses: on-policy it is 1
    obs = torch.randn(64, 3)
    sampled, logp, _ = trainer_side.act(obs)
    new_logp, _, _ = trainer_side.evaluate(obs, sampled)
    assert torch.allclose(new_logp, logp, atol=1e-5)
    assert np.all(trainer_side.env_actions(sampled) >= box.low) and np.all(trainer_side.env_actions(sampled) <= box.high)
    with pytest.raises(ConfigError, match="trainer.squash_actions"):
        build_policy(BOX, gym.spaces.Box(-np.inf, np.inf, (1,), np.float32), None, PPOConfig(squash_actions=True))
    with pytest.raises(ConfigError, match="trainer.squash_actions"):
        build_policy(BOX, gym.spaces.Discrete(2), None, PPOConfig(squash_actions=True))


def test_squashed_pendulum_rollout_stores_the_pre_squash_sample_and_updates_on_policy():
    env = gym.make("Pendulum-v1")
    policy = build_policy(env.observation_space, env.action_space, None, PPOConfig(squash_actions=True))
    with torch.no_grad():
        policy.log_std.fill_(1.5)                           # wide: many samples beyond the bounds before the tanh
    rollout, _ = _rollout("Pendulum-v1", steps=32, policy=policy)
    assert rollout.actions.abs().max() > 2.0                 # stored pre-squash, unclipped
    metrics = ppo_update(policy, torch.optim.Adam(policy.parameters(), lr=1e-3), rollout,
                         PPOConfig(squash_actions=True, update_epochs=1, num_minibatches=1))
    assert metrics["losses/approx_kl"] < 1e-6


def test_generators_carry_the_discounted_return_across_rollouts_when_the_trainer_scales_rewards():
    env = gym.make("CartPole-v1")
    policy = build_policy(env.observation_space, env.action_space, None, PPOConfig(normalize_reward=True, gamma=0.9))
    assert float(policy.reward_gamma) == pytest.approx(0.9)                   # travels in the state_dict
    assert "reward_gamma" in policy.state_dict()
    collector = RolloutCollector(GymGeneratorConfig(num_envs=2, num_steps=5), policy, seed=0)
    try:
        parts = [collector.collect() for _ in range(8)]                      # 40 steps: episodes span rollouts
    finally:
        collector.close()
    rewards = torch.cat([p.rewards for p in parts])
    dones = torch.cat([p.dones for p in parts])
    valid = torch.cat([p.valid for p in parts])
    carried = torch.cat([p.discounted_returns for p in parts])
    whole = discounted_returns(rewards, dones, 0.9)                          # one pass over all 40 steps
    assert torch.allclose(carried[valid], whole[valid])
    # computed per 5-step rollout instead, the return restarts at 0 and stays below 5 (1/(1-0.9) = 10 here)
    assert carried.max() > 5.0 and torch.cat([discounted_returns(p.rewards, p.dones, 0.9) for p in parts]).max() < 5.0
    scale_rewards(policy, parts[-1], 0.9)                                     # uses the shipped returns
    assert float(policy.return_rms.count) == pytest.approx(int(parts[-1].valid.sum()), abs=1e-3)
    assert ActorCritic(env.observation_space, env.action_space).reward_gamma == 0     # off unless scaling


def test_a_policy_checkpointed_before_the_travelling_flags_still_loads():
    policy = ActorCritic(BOX, BOX)
    old = {k: v for k, v in policy.state_dict().items() if k not in ("reward_gamma", "squash")}
    fresh = ActorCritic(BOX, BOX)
    fresh.load_state_dict(old)                                  # strict: nothing else may be missing
    assert float(fresh.reward_gamma) == 0 and not bool(fresh.squash)
