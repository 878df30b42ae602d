"""GRPO advantages, RLOO/REINFORCE baselines and the token-level clipped loss."""

import math

import pytest
import torch

from rlmesh.rl.algorithms.grpo import grpo_advantages, grpo_loss, masked_mean
from rlmesh.rl.losses import reinforce_advantages, rloo_advantages


def _t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def test_group_advantages_hand_values():
    rewards = _t(1, 0, 0, 1, 1, 1)  # two groups of 3
    adv = grpo_advantages(rewards, group_size=3, normalize_std=False)
    torch.testing.assert_close(adv, _t(2 / 3, -1 / 3, -1 / 3, 0, 0, 0))
    std = torch.tensor([1.0, 0.0, 0.0]).std()  # unbiased, sqrt(1/3)
    adv_n = grpo_advantages(rewards, group_size=3, normalize_std=True)
    torch.testing.assert_close(adv_n[:3], _t(2 / 3, -1 / 3, -1 / 3) / (std + 1e-6))
    torch.testing.assert_close(adv_n[3:], torch.zeros(3))  # unanimous group: no signal, no NaN


def test_group_advantages_reject_ragged_batches():
    with pytest.raises(ValueError, match="divisible by group_size=4"):
        grpo_advantages(torch.zeros(6), group_size=4)


def test_rloo_is_leave_one_out_and_scaled_grpo():
    rewards = _t(1, 0, 0, 0)
    torch.testing.assert_close(rloo_advantages(rewards, 4), _t(1, -1 / 3, -1 / 3, -1 / 3))
    torch.testing.assert_close(rloo_advantages(rewards, 4), grpo_advantages(rewards, 4, normalize_std=False) * 4 / 3)
    torch.testing.assert_close(reinforce_advantages(rewards, 0.25), _t(0.75, -0.25, -0.25, -0.25))
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        rloo_advantages(rewards, 1)


def test_masked_mean():
    x = _t(1, 2, 3, 4).view(2, 2)
    m = _t(1, 0, 1, 1).view(2, 2)
    torch.testing.assert_close(masked_mean(x, m), torch.tensor(8 / 3))
    torch.testing.assert_close(masked_mean(x, m, dim=1), _t(1.0, 3.5))


def test_on_policy_loss_is_minus_mean_advantage_and_masks_padding():
    lp = torch.zeros(2, 3)
    mask = _t(1, 1, 0, 1, 0, 0).view(2, 3)
    adv = _t(1.0, -2.0)
    tok = grpo_loss(lp, lp, adv, mask)
    # ratio 1 everywhere: token_mean = -(1 + 1 - 2) / 3 valid tokens
    torch.testing.assert_close(tok.loss, torch.tensor(-(1 + 1 - 2) / 3))
    seq = grpo_loss(lp, lp, adv, mask, aggregation="sequence_mean")
    torch.testing.assert_close(seq.loss, torch.tensor(-(1 + -2) / 2))
    # changing a masked position changes nothing
    lp2 = lp.clone()
    lp2[1, 2] = 5.0
    torch.testing.assert_close(grpo_loss(lp2, lp, adv, mask).loss, tok.loss)


def test_clip_and_clip_higher():
    old = torch.zeros(1, 2)
    new = _t(math.log(1.5), math.log(1.1)).view(1, 2)
    mask = torch.ones(1, 2)
    out = grpo_loss(new, old, _t(1.0), mask, clip_coef=0.2)
    torch.testing.assert_close(out.loss, torch.tensor(-(1.2 + 1.1) / 2))
    torch.testing.assert_close(out.clip_fraction, torch.tensor(0.5))
    higher = grpo_loss(new, old, _t(1.0), mask, clip_coef=0.2, clip_coef_high=0.28)
    torch.testing.assert_close(higher.loss, torch.tensor(-(1.28 + 1.1) / 2))


def test_k3_kl_penalty_hand_value_and_zero_at_reference():
    lp = _t(-1.0, -2.0).view(1, 2)
    ref = _t(-1.5, -2.0).view(1, 2)
    mask = torch.ones(1, 2)
    out = grpo_loss(lp, lp, _t(0.0), mask, ref_logprobs=ref, kl_coef=0.1)
    k3 = math.exp(-0.5) + 0.5 - 1.0  # exp(ref - lp) - (ref - lp) - 1 for the first token, 0 for the second
    torch.testing.assert_close(out.kl, torch.tensor(k3 / 2))
    torch.testing.assert_close(out.loss, torch.tensor(0.1 * k3 / 2))
    same = grpo_loss(lp, lp, _t(0.0), mask, ref_logprobs=lp, kl_coef=0.1)
    assert same.kl.item() == 0.0
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        grpo_loss(lp, lp, _t(0.0), mask, kl_coef=0.1)


def test_gradient_raises_logprob_of_positive_advantage_tokens():
    lp = torch.zeros(2, 2, requires_grad=True)
    grpo_loss(lp, lp.detach(), _t(1.0, -1.0), torch.ones(2, 2)).loss.backward()
    assert (lp.grad[0] < 0).all() and (lp.grad[1] > 0).all()


def test_batch_rows_train_informative_groups_and_average_over_the_whole_batch():
    from rlmesh.rl.algorithms.grpo import batch_rows

    informative = torch.tensor([True, False, True, False])  # groups of 2 rows
    trained, counted = batch_rows(informative, 2)
    assert trained.tolist() == [0, 1, 4, 5] and counted.tolist() == list(range(8))
    trained, counted = batch_rows(informative, 2, kl=True)  # the KL term has a gradient on unanimous groups
    assert trained.tolist() == counted.tolist() == list(range(8))
    trained, counted = batch_rows(informative, 2, kl=True, max_groups=1)  # dynamic sampling: the kept groups
    assert trained.tolist() == counted.tolist() == [0, 1]
