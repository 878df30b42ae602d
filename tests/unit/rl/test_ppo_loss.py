"""PPO loss parts against hand-computed values."""

import math

import torch

from rlmesh.rl.algorithms.ppo import ppo_loss


def _t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def _call(new_lp, old_lp, adv, **kw):
    n = len(adv)
    zeros = torch.zeros(n)
    kw.setdefault("normalize_advantages", False)
    return ppo_loss(new_lp, old_lp, adv, zeros, zeros, zeros, zeros, **kw)


def test_clipped_surrogate_hand_values():
    # ratios: e^0.5 = 1.6487 (clipped to 1.2 for A>0), e^-0.5 = 0.6065 (clipped to 0.8 for A<0)
    new_lp, old_lp = _t(0.5, -0.5, 0.1), _t(0.0, 0.0, 0.0)
    adv = _t(1.0, -1.0, 2.0)
    out = _call(new_lp, old_lp, adv, clip_coef=0.2)
    r = [math.exp(0.5), math.exp(-0.5), math.exp(0.1)]
    # min(r*A, clip(r)*A): A>0 -> min(1.6487, 1.2)=1.2; A<0 -> min(-0.6065, -0.8) = -0.8; third: min(2.2103, 2.2103)
    expected = -(1.2 + -0.8 + 2 * r[2]) / 3
    torch.testing.assert_close(out.policy_loss, torch.tensor(expected))
    # two of three ratios are outside [0.8, 1.2]
    torch.testing.assert_close(out.clip_fraction, torch.tensor(2 / 3))
    kl = sum((x - 1) - math.log(x) for x in r) / 3
    torch.testing.assert_close(out.approx_kl, torch.tensor(kl))


def test_gradient_vanishes_once_clipped_in_the_improving_direction():
    new_lp = _t(0.5).requires_grad_()
    out = _call(new_lp, _t(0.0), _t(1.0), clip_coef=0.2)
    out.loss.backward()
    assert new_lp.grad.abs().item() == 0.0
    new_lp2 = _t(0.1).requires_grad_()
    _call(new_lp2, _t(0.0), _t(1.0), clip_coef=0.2).loss.backward()
    assert new_lp2.grad.item() < 0  # still pushes the log-prob up


def test_value_loss_plain_and_clipped():
    new_v, old_v, ret = _t(2.0, 0.0), _t(0.0, 0.0), _t(1.0, 3.0)
    zeros = torch.zeros(2)
    plain = ppo_loss(zeros, zeros, zeros, new_v, old_v, ret, zeros, normalize_advantages=False)
    torch.testing.assert_close(plain.value_loss, torch.tensor(0.5 * (1.0 + 9.0) / 2))
    clipped = ppo_loss(zeros, zeros, zeros, new_v, old_v, ret, zeros, value_clip_coef=0.5, normalize_advantages=False)
    # sample 0: clipped V = 0.5 -> (0.5-1)^2 = 0.25, unclipped 1 -> max 1; sample 1: both 9
    torch.testing.assert_close(clipped.value_loss, torch.tensor(0.5 * (1.0 + 9.0) / 2))
    new_v2 = _t(0.0, 2.5)
    clipped2 = ppo_loss(zeros, zeros, zeros, new_v2, old_v, ret, zeros, value_clip_coef=0.5, normalize_advantages=False)
    # sample 1: unclipped (2.5-3)^2 = 0.25, clipped V=0.5 -> 6.25: pessimistic max = 6.25
    torch.testing.assert_close(clipped2.value_loss, torch.tensor(0.5 * (1.0 + 6.25) / 2))


def test_total_loss_combines_parts_and_entropy_bonus_lowers_it():
    zeros = torch.zeros(2)
    out = ppo_loss(zeros, zeros, _t(1.0, -1.0), _t(1.0, 1.0), zeros, zeros, _t(0.6, 0.8),
                   value_coef=0.5, entropy_coef=0.1, normalize_advantages=False)
    torch.testing.assert_close(out.entropy, torch.tensor(0.7))
    torch.testing.assert_close(out.loss, out.policy_loss + 0.5 * out.value_loss - 0.1 * out.entropy)
    assert set(out.metrics()) >= {"losses/approx_kl", "losses/clip_fraction", "losses/policy_loss"}


def test_advantage_normalisation_is_scale_invariant():
    lp = _t(0.1, -0.2, 0.3)
    a = _call(lp, torch.zeros(3), _t(1.0, 2.0, 3.0), normalize_advantages=True)
    b = _call(lp, torch.zeros(3), _t(10.0, 20.0, 30.0), normalize_advantages=True)
    torch.testing.assert_close(a.policy_loss, b.policy_loss)
