"""GAE against values computed by hand."""

import pytest
import torch

from rlmesh.rl.algorithms.ppo import compute_gae


def _t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def test_gae_matches_hand_computation_without_dones():
    # gamma=0.5, lambda=0.5: deltas d_t = r_t + 0.5 V_{t+1} - V_t
    rewards, values, next_values = _t(1, 2, 3), _t(0.5, 1.0, 1.5), _t(1.0, 1.5, 2.0)
    zeros = torch.zeros(3)
    adv, ret = compute_gae(rewards, values, next_values, zeros, zeros, gamma=0.5, gae_lambda=0.5)
    d = [1 + 0.5 * 1.0 - 0.5, 2 + 0.5 * 1.5 - 1.0, 3 + 0.5 * 2.0 - 1.5]  # 1.0, 1.75, 2.5
    a2 = d[2]
    a1 = d[1] + 0.25 * a2
    a0 = d[0] + 0.25 * a1
    torch.testing.assert_close(adv, _t(a0, a1, a2))
    torch.testing.assert_close(ret, adv + values)


def test_termination_cuts_bootstrap_and_recursion():
    rewards, values, next_values = _t(1, 1, 1), _t(0, 0, 0), _t(10, 10, 10)
    terminated = dones = _t(0, 1, 0)
    adv, _ = compute_gae(rewards, values, next_values, terminated, dones, gamma=1.0, gae_lambda=1.0)
    # step 2: 1 + 10; step 1 terminal: 1 (no bootstrap, no carry); step 0: 1 + 10 + adv1
    torch.testing.assert_close(adv, _t(1 + 10 + 1, 1, 11))


def test_truncation_bootstraps_from_final_value_but_cuts_recursion():
    rewards, values, next_values = _t(1, 1), _t(0, 0), _t(5, 7)
    terminated, dones = _t(0, 0), _t(1, 0)  # step 0 truncated (time limit)
    adv, _ = compute_gae(rewards, values, next_values, terminated, dones, gamma=0.9, gae_lambda=0.95)
    torch.testing.assert_close(adv, _t(1 + 0.9 * 5, 1 + 0.9 * 7))


def test_lambda_one_gives_discounted_return_minus_value():
    rewards = torch.rand(6, 3)
    values = torch.rand(6, 3)
    last = torch.rand(3)
    next_values = torch.cat([values[1:], last[None]])
    zeros = torch.zeros(6, 3)
    adv, ret = compute_gae(rewards, values, next_values, zeros, zeros, gamma=0.9, gae_lambda=1.0)
    mc = last.clone()
    expected = torch.zeros(6, 3)
    for t in range(5, -1, -1):
        mc = rewards[t] + 0.9 * mc
        expected[t] = mc
    torch.testing.assert_close(ret, expected)


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match="share a shape"):
        compute_gae(torch.zeros(3), torch.zeros(3), torch.zeros(2), torch.zeros(3), torch.zeros(3), 0.9, 0.9)
