"""KL estimators, controllers and the in-reward KL penalty against hand-computed values."""

import math

import pytest
import torch

from easyrl.algorithms.kl import (
    KL_ESTIMATORS,
    KLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
)

D = torch.float64
# logp - ref per token: 0.5, 0, -1
LOGP = torch.tensor([[-1.0, -0.5, -2.0]], dtype=D)
REF = torch.tensor([[-1.5, -0.5, -1.0]], dtype=D)


@pytest.mark.parametrize(
    "estimator, expected",
    [
        ("kl", [0.5, 0.0, -1.0]),
        ("k1", [0.5, 0.0, -1.0]),
        ("abs", [0.5, 0.0, 1.0]),
        ("mse", [0.125, 0.0, 0.5]),  # 0.5 * d^2
        ("k2", [0.125, 0.0, 0.5]),
        # x = ref - logp = -0.5, 0, 1:  exp(x) - x - 1
        ("low_var_kl", [math.exp(-0.5) + 0.5 - 1, 0.0, math.e - 2]),
        ("k3", [math.exp(-0.5) + 0.5 - 1, 0.0, math.e - 2]),
    ],
)
def test_estimators_hand_values(estimator, expected):
    torch.testing.assert_close(kl_penalty(LOGP, REF, estimator), torch.tensor([expected], dtype=D))


def test_low_var_kl_clamps():
    # x = ref - logp: -5 -> exp(-5) + 5 - 1 = 4.0067 (inside [-10, 10]); 30 and -30 -> clamped to 10
    logp = torch.tensor([[5.0, 0.0, 30.0]], dtype=D)
    ref = torch.tensor([[0.0, 30.0, 0.0]], dtype=D)
    out = kl_penalty(logp, ref, "low_var_kl")
    torch.testing.assert_close(out, torch.tensor([[math.exp(-5) + 4, 10.0, 10.0]], dtype=D))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_straight_through_variants_keep_the_value_and_take_k2s_gradient(base):
    logp = LOGP.clone().requires_grad_(True)
    value = kl_penalty(logp, REF, base + "+")
    torch.testing.assert_close(value, kl_penalty(LOGP, REF, base))
    value.sum().backward()
    # grad of 0.5 (logp - ref)^2 w.r.t. logp: logp - ref = 0.5, 0, -1
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5, 0.0, -1.0]], dtype=D))


def test_k3_as_a_loss_has_the_forward_kl_gradient():
    # d k3 / d logp = 1 - exp(ref - logp) = 1 - pi_ref/pi: x = ref - logp = -0.5, 0, 1
    logp = LOGP.clone().requires_grad_(True)
    kl_penalty(logp, REF, "k3").sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[1 - math.exp(-0.5), 0.0, 1 - math.e]], dtype=D))


def test_low_var_kl_gradient_is_finite_far_from_reference():
    logp = torch.tensor([-80.0, -1.0], dtype=D, requires_grad=True)
    kl_penalty(logp, torch.tensor([0.0, -1.2], dtype=D), "low_var_kl").sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_unknown_estimator_lists_names():
    with pytest.raises(ValueError) as err:
        kl_penalty(LOGP, REF, "full")
    for name in KL_ESTIMATORS:
        assert name in str(err.value)


def test_fixed_controller():
    ctrl = KLController(0.05)
    ctrl.update(current_kl=100.0, n_steps=1000)
    assert ctrl.value == 0.05


def test_adaptive_controller_hand_values():
    ctrl = KLController(0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=9.0, n_steps=256)  # 9/6 - 1 = 0.5 -> clipped to 0.2; x (1 + 0.2 * 256 / 10000)
    assert ctrl.value == pytest.approx(0.1 * 1.00512)
    ctrl.update(current_kl=5.4, n_steps=100)  # 5.4/6 - 1 = -0.1; x (1 - 0.1 * 100 / 10000) = x 0.999
    assert ctrl.value == pytest.approx(0.1 * 1.00512 * 0.999)
    ctrl.update(current_kl=0.0, n_steps=500)  # -1 -> clipped to -0.2; x (1 - 0.2 * 500 / 10000) = x 0.99
    assert ctrl.value == pytest.approx(0.1 * 1.00512 * 0.999 * 0.99)


def test_make_kl_controller_follows_kl_type():
    fixed = make_kl_controller("fixed", 0.3, kl_target=0.1, kl_horizon=100)
    adaptive = make_kl_controller("adaptive", 0.3, kl_target=0.1, kl_horizon=100)
    assert fixed.target is None and fixed.value == 0.3
    assert adaptive.value == 0.3 and (adaptive.target, adaptive.horizon) == (0.1, 100)
    with pytest.raises(ValueError, match="kl_type"):
        make_kl_controller("pid", 0.3, 0.1, 100)


@pytest.mark.parametrize("kwargs", [dict(target_kl=0.0, horizon=10), dict(target_kl=1.0, horizon=0)])
def test_adaptive_controller_rejects_bad_config(kwargs):
    with pytest.raises(ValueError):
        KLController(0.1, **kwargs)


def _batch():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]], dtype=D)
    old = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -3.0, 5.0]], dtype=D)
    ref = torch.tensor([[-1.5, -0.5, -1.0], [-0.5, -2.0, 0.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
    return scores, old, ref, mask


def test_apply_kl_penalty_fixed():
    scores, old, ref, mask = _batch()
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, KLController(0.5), "kl")
    # k1 = old - ref: row 0: 0.5 0 -1; row 1: 0.2 -1 (5, padding -> 0)
    # rewards = scores - 0.5 * k1
    expected = torch.tensor([[-0.25, 0.0, 1.5], [-0.1, 2.5, 7.0]], dtype=D)
    torch.testing.assert_close(rewards, expected)
    # per-sequence token mean: (0.5 + 0 - 1)/3 = -1/6, (0.2 - 1)/2 = -0.4; batch mean (-1/6 - 0.4)/2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx((-1 / 6 - 0.4) / 2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5


def test_apply_kl_penalty_updates_adaptive_controller():
    scores, old, ref, mask = _batch()
    ctrl = KLController(0.2, target_kl=0.1, horizon=100)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, "low_var_kl")
    # k3 with x = ref - old: row 0: -0.5, 0, 1; row 1: -0.2, 1
    k3 = lambda x: math.exp(x) - x - 1  # noqa: E731
    kl_row0 = [k3(-0.5), 0.0, k3(1.0)]
    kl_row1 = [k3(-0.2), k3(1.0)]
    torch.testing.assert_close(rewards[1, :2], torch.tensor([0.0 - 0.2 * kl_row1[0], 2.0 - 0.2 * kl_row1[1]], dtype=D))
    torch.testing.assert_close(rewards[0], torch.tensor([0.0 - 0.2 * kl_row0[0], 0.0, 1.0 - 0.2 * kl_row0[2]], dtype=D))
    batch_kl = (sum(kl_row0) / 3 + sum(kl_row1) / 2) / 2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(batch_kl)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.2  # the coefficient used, before the update
    error = max(-0.2, min(0.2, batch_kl / 0.1 - 1))
    assert ctrl.value == pytest.approx(0.2 * (1 + error * 2 / 100))  # n_steps = bsz = 2
