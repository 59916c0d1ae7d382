"""GAE and the clipped value loss against hand-computed values."""

import numpy as np
import pytest
import torch

from easyrl.algorithms.advantages import AdvantageInputs, compute_advantage
from easyrl.algorithms.critic import compute_value_loss, gae_advantage

D = torch.float64
# row 0: 3 valid tokens, outcome reward 1 on the last; row 1: 2 valid tokens and padding holding junk (99, 7)
REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 99.0]], dtype=D)
VALUES = torch.tensor([[0.5, 0.2, 0.4], [1.0, -1.0, 7.0]], dtype=D)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)


def _gae(rewards=REWARDS, mask=MASK, values=VALUES, **settings):
    """``gae_advantage`` on one group id per sample (GAE ignores them)."""
    return gae_advantage(AdvantageInputs(rewards, mask, np.arange(len(rewards)), values=values, **settings))


def test_gae_hand_values():
    adv, returns = _gae(gamma=0.9, lam=0.8)
    # row 0, gamma * lam = 0.72:
    #   t=2: delta = 1 + 0.9 * 0 - 0.4 = 0.6                    A = 0.6
    #   t=1: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16                 A = 0.16 + 0.72 * 0.6 = 0.592
    #   t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32                A = -0.32 + 0.72 * 0.592 = 0.10624
    # row 1: t=1: delta = 2 + 0 - (-1) = 3, A = 3;  t=0: delta = 0.9 * (-1) - 1 = -1.9, A = -1.9 + 0.72 * 3 = 0.26
    raw = torch.tensor([[0.10624, 0.592, 0.6], [0.26, 3.0, 0.0]], dtype=D)
    torch.testing.assert_close(returns, (raw + VALUES) * MASK)  # R = A + V: 0.60624 0.792 1.0 | 1.26 2.0
    valid = raw[MASK.bool()]
    whitened = (raw - valid.mean()) / torch.sqrt(valid.var() + 1e-8) * MASK  # over the 5 valid tokens, unbiased var
    torch.testing.assert_close(adv, whitened)


def test_gae_lambda_limits():
    # lam = 1, gamma = 1: A_t = (sum of rewards from t) - V_t (Monte Carlo); lam = 0: A_t = the TD error delta_t
    _, returns = _gae(gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]], dtype=D))
    _, returns = _gae(gamma=0.5, lam=0.0)
    # R_t = delta_t + V_t = r_t + gamma * V_{t+1}: row 0: 0.1, 0.2, 1; row 1: -0.5, 2
    torch.testing.assert_close(returns, torch.tensor([[0.1, 0.2, 1.0], [-0.5, 2.0, 0.0]], dtype=D))


def test_gae_masked_token_inside_a_response_passes_through():
    # the middle token is masked: it adds no TD error, and the value after token 0 is token 2's (undiscounted skip)
    mask = torch.tensor([[1, 0, 1]], dtype=D)
    _, returns = _gae(REWARDS[:1], mask, VALUES[:1], gamma=0.5, lam=1.0)
    # t=2: A = 1 - 0.4 = 0.6, R = 1; t=0: delta = 0 + 0.5 * 0.4 - 0.5 = -0.3, A = -0.3 + 0.5 * 0.6 = 0, R = 0.5
    torch.testing.assert_close(returns, torch.tensor([[0.5, 0.0, 1.0]], dtype=D))


def test_gae_is_registered_and_needs_values():
    adv, _ = compute_advantage("gae", AdvantageInputs(REWARDS, MASK, np.array(["a", "b"]), values=VALUES, gamma=0.9,
                                                      lam=0.8, norm_adv_by_std_in_grpo=True, reward_baselines=None))
    torch.testing.assert_close(adv, _gae(gamma=0.9, lam=0.8)[0])
    with pytest.raises(ValueError, match="critic"):
        compute_advantage("gae", AdvantageInputs(REWARDS, MASK, np.array(["a", "b"])))


def test_value_loss_hand_values_and_gradient():
    # token 0: V_old 0.5, V 1.0 -> clipped to 0.7 (c = 0.2); R = 2: (1 - 2)^2 = 1 < (0.7 - 2)^2 = 1.69 -> clipped term
    # token 1: V_old 0.5, V 0.4 inside the range; R = -1: both terms (1.4)^2 = 1.96
    # token 2: padding (junk) ignored
    vpreds = torch.tensor([[1.0, 0.4, 50.0]], dtype=D, requires_grad=True)
    values = torch.tensor([[0.5, 0.5, 0.0]], dtype=D)
    returns = torch.tensor([[2.0, -1.0, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0]], dtype=D)
    loss, metrics = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(0.5 * (1.69 + 1.96) / 2)
    assert metrics["vf_clipfrac"] == pytest.approx(0.5)
    assert metrics["vpred_mean"] == pytest.approx(0.7)
    loss.backward()
    # the clipped term is flat in V (clamp saturated): token 0 gets no gradient; token 1: (V - R) / 2 tokens = 0.7
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 0.7, 0.0]], dtype=D))


def test_value_loss_uses_aggregation_and_rejects_bad_clip():
    vpreds = torch.tensor([[1.0, 3.0], [2.0, 0.0]], dtype=D)
    zeros = torch.zeros_like(vpreds)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=D)
    # c large: plain 0.5 (V - R)^2 = 0.5, 4.5 | 2.0; seq-mean-token-sum: (5.0 + 2.0) / 2 sequences
    loss, _ = compute_value_loss(vpreds, zeros, zeros, mask, cliprange_value=100.0, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(3.5)
    with pytest.raises(ValueError, match="cliprange_value"):
        compute_value_loss(vpreds, zeros, zeros, mask, cliprange_value=0.0, loss_agg_mode="token-mean")
