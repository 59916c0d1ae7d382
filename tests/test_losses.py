"""Loss aggregation (incl. global normalisation), policy losses and TIS weights against hand-computed values."""

import dataclasses
import math
import random

import pytest
import torch

from easyrl.algorithms.loss_agg import LOSS_AGG_MODES, agg_loss, mask_counts
from easyrl.algorithms.policy_losses import POLICY_LOSSES, PolicyLossInputs, PolicyLossSettings
from easyrl.algorithms.rollout_correction import compute_tis_weights
from easyrl.config import ActorConfig

D = torch.float64
NAN = float("nan")

# ------------------------------------------------------------------------------------------------ agg_loss

# 4 sequences, max length 4, uneven: lengths 3, 1, 0 (empty), 4. Padding holds junk (99, NaN) that must be ignored.
LOSS = torch.tensor(
    [[1.0, 2.0, 3.0, 99.0], [4.0, NAN, NAN, NAN], [5.0, 5.0, 5.0, 5.0], [2.0, 2.0, 2.0, 6.0]], dtype=D
)
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=D)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 22 / 8),  # (1+2+3 + 4 + 2+2+2+6) / 8 valid tokens
        ("seq-mean-token-sum", 22 / 3),  # sums 6, 4, 12 over the 3 non-empty sequences
        ("seq-mean-token-mean", (6 / 3 + 4 / 1 + 12 / 4) / 3),  # = 3
        ("token-sum", 22.0),  # verl 0.9: no normalisation
        ("seq-mean-token-sum-norm", (6 / 4 + 4 / 4 + 12 / 4) / 3),  # verl 0.7.1-0.9.1 = Dr. GRPO: mean over 3 seqs
        ("seq-mean-token-sum-norm-drgrpo", (6 / 4 + 4 / 4 + 12 / 4) / 3),  # Dr. GRPO: a mean over the 3 sequences
    ],
)
def test_agg_loss_hand_values(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_agg_loss_norm_length_and_global_counts():
    # Dr. GRPO constant 8 instead of the padded length: (6/8 + 4/8 + 12/8) / 3, under both names
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm-drgrpo", norm_length=8).item() == pytest.approx(22 / 24)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=8).item() == pytest.approx(22 / 24)
    # verl 0.7.1+: divided by the global sequence count, times dp_size; token-sum ignores the counts
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", global_num_seqs=5, dp_size=2).item() == (
        pytest.approx(22 / 4 / 5 * 2)
    )
    assert agg_loss(LOSS, MASK, "token-sum", global_num_tokens=16, dp_size=2).item() == pytest.approx(22 * 2)
    # global denominators and dp_size: 22 / 16 tokens * 2 ranks; 22 / 5 seqs * 2
    assert agg_loss(LOSS, MASK, "token-mean", global_num_tokens=16, dp_size=2).item() == pytest.approx(22 / 16 * 2)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", global_num_seqs=torch.tensor(5), dp_size=2).item() == (
        pytest.approx(22 / 5 * 2)
    )


def test_agg_loss_empty_batch_is_zero():
    assert agg_loss(LOSS[2:3], MASK[2:3], "token-mean").item() == 0.0
    assert agg_loss(LOSS[2:3], MASK[2:3], "seq-mean-token-mean").item() == 0.0


def test_agg_loss_unknown_mode_raises():
    with pytest.raises(ValueError) as err:
        agg_loss(LOSS, MASK, "sum")
    for mode in LOSS_AGG_MODES:
        assert mode in str(err.value)


def test_mask_counts():
    assert mask_counts(MASK) == (8, 3)


def _random_minibatch(seed, bsz=8, resp_len=6):
    rng = random.Random(seed)
    lengths = [rng.randint(1, resp_len) for _ in range(bsz)]
    lengths[5] = 0  # one fully masked sequence
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(resp_len)] for n in lengths], dtype=D)
    x = torch.tensor([[rng.uniform(-2, 2) for _ in range(resp_len)] for _ in range(bsz)], dtype=D)
    return x, mask


def _toy_loss(theta, x):
    """A per-token loss depending on a toy parameter ``theta`` (resp_len,)."""
    return x * theta + 0.5 * (x * theta) ** 2


def _split_run(x, mask, theta, mode, dp_size=2, micro_per_rank=2):
    """Simulate dp ranks x micro-batches: per rank sum micro-batch losses/grads; then mean over ranks
    (what FSDP's gradient all-reduce does). Micro-batches are trimmed to their own longest response, so they are
    padded differently, as with dynamic batching."""
    resp_len = x.shape[1]
    num_tokens, num_seqs = mask_counts(mask)  # global counts of the whole mini-batch
    kwargs = dict(global_num_tokens=num_tokens, global_num_seqs=num_seqs, dp_size=dp_size, norm_length=resp_len)
    rank_losses, rank_grads = [], []
    for rank_rows in torch.arange(x.shape[0]).chunk(dp_size):
        loss_sum, grad_sum = 0.0, torch.zeros_like(theta)
        for rows in rank_rows.chunk(micro_per_rank):
            width = max(int(mask[rows].sum(-1).max()), 1)
            xm, mm = x[rows, :width], mask[rows, :width]
            loss = agg_loss(_toy_loss(theta[:width], xm), mm, mode, **kwargs)
            (grad,) = torch.autograd.grad(loss, theta)
            loss_sum += loss.item()
            grad_sum += grad
        rank_losses.append(loss_sum)
        rank_grads.append(grad_sum)
    return sum(rank_losses) / dp_size, torch.stack(rank_grads).mean(0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_global_normalisation_invariance_value_and_gradient(mode):
    x, mask = _random_minibatch(seed=3)
    theta = torch.linspace(0.5, 1.5, x.shape[1], dtype=D, requires_grad=True)
    full = agg_loss(_toy_loss(theta, x), mask, mode)
    (full_grad,) = torch.autograd.grad(full, theta)
    split_loss, split_grad = _split_run(x, mask, theta, mode)
    assert split_loss == pytest.approx(full.item())
    torch.testing.assert_close(split_grad, full_grad)


def test_local_means_are_not_invariant():
    # the reason for global normalisation: averaging per-micro-batch token means weights tokens unequally
    x, mask = _random_minibatch(seed=3)
    theta = torch.ones(x.shape[1], dtype=D)
    full = agg_loss(_toy_loss(theta, x), mask, "token-mean").item()
    micro = [agg_loss(_toy_loss(theta, x[r]), mask[r], "token-mean").item() for r in torch.arange(8).chunk(4)]
    assert sum(micro) / 4 != pytest.approx(full)


# ------------------------------------------------------------------------------------------- policy losses

CLIP = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_dual=3.0)  # clip range [0.8, 1.28]


def _policy_loss(name, old, log_prob, adv, mask, *, rollout_is_weights=None, agg_kwargs=None, **settings):
    """``(pg_loss, metrics)`` of the loss ``name``; ``settings``: ``worker.actor`` fields (the others: defaults)."""
    inputs = PolicyLossInputs(old, log_prob, adv, mask, rollout_is_weights=rollout_is_weights, agg_kwargs=agg_kwargs)
    return POLICY_LOSSES.get(name)(inputs, PolicyLossSettings.of(ActorConfig(**settings)))


def test_the_loss_settings_are_worker_actor_fields_whose_only_defaults_are_the_config_s():
    actor = {f.name: f for f in dataclasses.fields(ActorConfig)}
    for f in dataclasses.fields(PolicyLossSettings):
        assert f.name in actor, f.name
        assert (f.default, f.default_factory) == (dataclasses.MISSING, dataclasses.MISSING), f.name
    assert PolicyLossSettings.of(ActorConfig(tau_negative=2.0)).tau_negative == 2.0


def _policy_batch():
    """Row 0: A = +1, ratios 1.5, 0.5, 1.1.  Row 1: A = -2, ratios 4, 0.5, (padding)."""
    ratios = torch.tensor([[1.5, 0.5, 1.1], [4.0, 0.5, 1.2]], dtype=D)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.7, -1.0]], dtype=D)
    log_prob = (old + ratios.log()).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
    return old, log_prob, adv, mask, ratios


def test_vanilla_hand_values():
    old, log_prob, adv, mask, ratios = _policy_batch()
    loss, m = _policy_loss("vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean", **CLIP)
    # A=+1: r=1.5: max(-1.5, -1.28) = -1.28 (clipped) | r=0.5: max(-0.5, -0.8) = -0.5 | r=1.1: -1.1
    # A=-2: r=4: max(8, 2.56) = 8, dual bound -A*3 = 6 -> 6 (dual clip) | r=0.5: max(1.0, 1.6) = 1.6 (clipped)
    assert loss.item() == pytest.approx((-1.28 - 0.5 - 1.1 + 6.0 + 1.6) / 5)
    assert m["pg_clipfrac"] == pytest.approx(2 / 5)
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 5)
    assert m["ppo_kl"] == pytest.approx(-sum(math.log(r) for r in [1.5, 0.5, 1.1, 4.0, 0.5]) / 5)
    loss.backward()
    # d(-A r)/dlogp = -A r on unclipped tokens, 0 on clipped / dual-clipped / padding; token-mean divides by 5
    expected_grad = torch.tensor([[0.0, -0.5, -1.1], [0.0, 0.0, 0.0]], dtype=D) / 5
    torch.testing.assert_close(log_prob.grad, expected_grad)


@pytest.mark.parametrize(
    "advantage, ratio, expected_loss, dual",
    [
        (-1.0, 4.0, 3.0, True),  # A<0, large ratio: max(4, 1.28) = 4 > c|A| = 3 -> 3
        (-1.0, 1.5, 1.5, False),  # A<0, ratio 1.5: max(1.5, 1.28) = 1.5 < 3 -> untouched
        (1.0, 4.0, -1.28, False),  # A>0, large ratio: ordinary clip, no dual clip
        (1.0, 0.1, -0.1, False),  # A>0, tiny ratio: max(-0.1, -0.8) = -0.1
    ],
)
def test_dual_clip_only_for_negative_advantage_and_large_ratio(advantage, ratio, expected_loss, dual):
    old = torch.zeros(1, 1, dtype=D)
    log_prob = torch.full((1, 1), math.log(ratio), dtype=D)
    adv = torch.full((1, 1), advantage, dtype=D)
    loss, m = _policy_loss("vanilla", old, log_prob, adv, torch.ones(1, 1), loss_agg_mode="token-mean", **CLIP)
    assert loss.item() == pytest.approx(expected_loss)
    assert m["pg_clipfrac_lower"] == (1.0 if dual else 0.0)


def test_vanilla_rejects_bad_dual_clip():
    old, log_prob, adv, mask, _ = _policy_batch()
    with pytest.raises(ValueError, match="clip_ratio_dual"):
        _policy_loss("vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean", clip_ratio_low=0.2,
                     clip_ratio_high=0.2, clip_ratio_dual=1.0)


def test_vanilla_log_ratio_is_clamped():
    old = torch.tensor([[-100.0]], dtype=D)
    log_prob = torch.tensor([[0.0]], dtype=D, requires_grad=True)  # log-ratio 100 -> clamped to 20
    loss, _ = _policy_loss("vanilla", old, log_prob, torch.tensor([[-1.0]], dtype=D), torch.ones(1, 1),
                           loss_agg_mode="token-mean", **CLIP)
    loss.backward()
    assert loss.item() == pytest.approx(3.0) and torch.isfinite(log_prob.grad).all()


def test_rollout_is_weights_multiply_per_token_loss_and_stay_detached():
    old, log_prob, adv, mask, _ = _policy_batch()
    weights = torch.tensor([[1.0, 2.0, 0.5], [1.0, 1.0, 1.0]], dtype=D, requires_grad=True)
    loss, _ = _policy_loss("vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean",
                           rollout_is_weights=weights, **CLIP)
    # per-token losses -1.28 -0.5 -1.1 | 6 1.6, weighted by 1 2 .5 | 1 1
    assert loss.item() == pytest.approx((-1.28 - 1.0 - 0.55 + 6.0 + 1.6) / 5)
    loss.backward()
    assert weights.grad is None


def test_policy_loss_uses_agg_kwargs():
    old, log_prob, adv, mask, _ = _policy_batch()
    loss, _ = _policy_loss("vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean",
                           agg_kwargs=dict(global_num_tokens=10, dp_size=4), **CLIP)
    assert loss.item() == pytest.approx((-1.28 - 0.5 - 1.1 + 6.0 + 1.6) / 10 * 4)


def test_gspo_ratio_is_sequence_level():
    # row 0: log-ratios .3 -.1 .1 -> mean .1 -> s = e^.1 = 1.105 inside [0.8, 1.28] although token 0's own ratio
    #        e^.3 = 1.35 is outside: GSPO does not clip it. A = +1.
    # row 1: log-ratios .6 .4 (padding 5) -> mean .5 -> s = e^.5 = 1.649 > 1.28: clipped. A = +1.
    # row 2: log-ratios -.5 -.5 -.5 -> s = e^-.5 = .607 < .8, A = -1: clipped to .8.
    log_ratio = torch.tensor([[0.3, -0.1, 0.1], [0.6, 0.4, 5.0], [-0.5, -0.5, -0.5]], dtype=D)
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.2, -1.0], [-1.0, -1.0, -1.0]], dtype=D)
    log_prob = (old + log_ratio).requires_grad_(True)
    adv = torch.tensor([[1.0] * 3, [1.0] * 3, [-1.0] * 3], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=D)
    loss, m = _policy_loss("gspo", old, log_prob, adv, mask, loss_agg_mode="seq-mean-token-mean", **CLIP)
    s0 = math.exp(0.1)
    # seq-mean-token-mean: row 0 every token -s0; row 1 every token -1.28; row 2 every token max(.607, .8) = .8
    assert loss.item() == pytest.approx((-s0 - 1.28 + 0.8) / 3)
    assert m["pg_clipfrac"] == pytest.approx(5 / 8)  # rows 1 and 2 (2 + 3 valid tokens) are clipped
    assert m["pg_clipfrac_lower"] == 0.0
    loss.backward()
    # d(-A s_it)/dlogp_it = -A s_i: identical on all tokens of row 0 (/ 3 tokens / 3 seqs); clipped rows: 0
    expected = torch.tensor([[-s0 / 9] * 3, [0.0] * 3, [0.0] * 3], dtype=D)
    torch.testing.assert_close(log_prob.grad, expected)


def test_cispo_hand_values():
    # ratios 1.5, 0.5, 1 -> clipped IS weights 1.28, 0.8, 1 (detached); A = 1, -1, 2; logp = -.5, -1, -2
    log_prob = torch.tensor([[-0.5, -1.0, -2.0]], dtype=D, requires_grad=True)
    old = log_prob.detach() - torch.tensor([[math.log(1.5), math.log(0.5), 0.0]], dtype=D)
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    loss, m = _policy_loss("cispo", old, log_prob, adv, mask, loss_agg_mode="token-mean", **CLIP)
    # -w A logp: -1.28*1*(-.5) = .64; -.8*(-1)*(-1) = -.8; -1*2*(-2) = 4 -> mean 3.84/3
    assert loss.item() == pytest.approx(3.84 / 3)
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)
    loss.backward()
    # gradient -w A / 3 on every token, clipped ones included (CISPO never drops a token's gradient)
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.28 / 3, 0.8 / 3, -2.0 / 3]], dtype=D))


def test_cispo_without_lower_bound():
    # clip_ratio_low = 1 -> lower bound 0: the weight 0.5 is kept
    log_prob = torch.tensor([[-1.0]], dtype=D)
    old = log_prob - math.log(0.5)
    loss, _ = _policy_loss("cispo", old, log_prob, torch.ones(1, 1, dtype=D), torch.ones(1, 1),
                           loss_agg_mode="token-mean", clip_ratio_low=1.0, clip_ratio_high=0.28,
                           clip_ratio_dual=3.0)
    assert loss.item() == pytest.approx(-0.5 * 1.0 * -1.0)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "sapo"])
def test_on_policy_gradient_is_policy_gradient(name):
    # at ratio 1 no clipping is active: every loss has gradient -A/N w.r.t. logp (token-mean)
    old = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], dtype=D)
    log_prob = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [-0.5, -0.5]], dtype=D)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=D)
    loss, m = _policy_loss(name, old, log_prob, adv, mask, loss_agg_mode="token-mean", **CLIP)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -adv * mask / 3)
    assert m["pg_clipfrac"] == 0.0 and m["ppo_kl"] == 0.0


def test_unknown_policy_loss_lists_names():
    with pytest.raises(ValueError) as err:
        POLICY_LOSSES.get("ppo2")
    for name in POLICY_LOSSES:
        assert name in str(err.value)
    assert set(POLICY_LOSSES) >= {"vanilla", "gspo", "cispo", "sapo"}


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo_hand_values_and_gradient():
    # token 0: A = +2, r = 1.5, tau_pos = 1:    f = 4 * sig(0.5),              loss -2 f
    # token 1: A = -1, r = 0.5, tau_neg = 1.05: f = 4/1.05 * sig(1.05 * -0.5), loss +f
    # token 2: A = +1, r = 1 (on policy):       f = 4 * sig(0) = 2,             loss -2
    # token 3: padding (ratio 9, A 5): ignored
    ratios = torch.tensor([[1.5, 0.5, 1.0, 9.0]], dtype=D)
    old = torch.tensor([[-1.0, -2.0, -0.3, -1.0]], dtype=D)
    log_prob = (old + ratios.log()).requires_grad_(True)
    adv = torch.tensor([[2.0, -1.0, 1.0, 5.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=D)
    loss, m = _policy_loss("sapo", old, log_prob, adv, mask, loss_agg_mode="token-mean", **CLIP,
                           tau_positive=1.0, tau_negative=1.05)
    f0, f1 = 4 * _sigmoid(0.5), 4 / 1.05 * _sigmoid(-0.525)
    assert loss.item() == pytest.approx((-2 * f0 + f1 - 2.0) / 3)
    assert m["pg_clipfrac"] == 0.0 and m["pg_clipfrac_lower"] == 0.0
    assert m["ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 3)
    loss.backward()
    # dl/dlogp = -A * f'(r) * r with f'(r) = 4 sig(x)(1 - sig(x)), x = tau (r - 1); no token's gradient is cut off
    s0, s1 = _sigmoid(0.5), _sigmoid(-0.525)
    expected = torch.tensor([[-2 * 4 * s0 * (1 - s0) * 1.5, 1 * 4 * s1 * (1 - s1) * 0.5, -1.0, 0.0]], dtype=D) / 3
    torch.testing.assert_close(log_prob.grad, expected)


def test_sapo_temperature_sets_how_fast_the_gate_decays():
    # far off policy (r = 3, A = +1) a hotter gate (larger tau) passes less gradient than a cooler one
    grads = []
    for tau in (0.5, 4.0):
        log_prob = torch.tensor([[math.log(3.0)]], dtype=D, requires_grad=True)
        loss, _ = _policy_loss("sapo", torch.zeros(1, 1, dtype=D), log_prob, torch.ones(1, 1, dtype=D),
                               torch.ones(1, 1), loss_agg_mode="token-mean", **CLIP, tau_positive=tau)
        loss.backward()
        grads.append(-log_prob.grad.item())
        x = tau * 2.0
        assert grads[-1] == pytest.approx(4 * _sigmoid(x) * (1 - _sigmoid(x)) * 3.0)
    assert grads[0] > grads[1] > 0


def test_sapo_rejects_bad_temperature():
    old, log_prob, adv, mask, _ = _policy_batch()
    with pytest.raises(ValueError, match="tau"):
        _policy_loss("sapo", old, log_prob, adv, mask, loss_agg_mode="token-mean", **CLIP, tau_negative=0.0)


def test_losses_ignore_settings_they_do_not_use():
    old, log_prob, adv, mask, _ = _policy_batch()
    for name in ("vanilla", "gspo", "cispo"):
        plain, _ = _policy_loss(name, old, log_prob, adv, mask, loss_agg_mode="token-mean", **CLIP)
        extra, _ = _policy_loss(name, old, log_prob, adv, mask, loss_agg_mode="token-mean", **CLIP,
                                tau_positive=0.3, tau_negative=7.0)
        assert extra.item() == plain.item()


# -------------------------------------------------------------------------------------------- TIS weights


def test_tis_weights_hand_values():
    # row 0: p_old .5 .9 .2 vs p_rollout .25 .9 .4 -> raw 2 1 .5 -> cap 1.5 -> 1.5 1 .5
    # row 1: p_old .6 .1 (pad) vs p_rollout .1 .1 -> raw 6 1 -> 1.5 1, padding 0
    p_old = torch.tensor([[0.5, 0.9, 0.2], [0.6, 0.1, 0.3]], dtype=D)
    p_roll = torch.tensor([[0.25, 0.9, 0.4], [0.1, 0.1, 0.9]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
    w, m = compute_tis_weights(p_old.log(), p_roll.log(), mask, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.0, 0.5], [1.5, 1.0, 0.0]], dtype=D))
    assert not w.requires_grad
    assert m["rollout/tis_weight_mean"] == pytest.approx(5.5 / 5)
    assert m["rollout/tis_clip_frac"] == pytest.approx(2 / 5)
    # |p_rollout - p_old|: .25 0 .2 | .5 0 -> mean .95/5, max .5 (the padding's .6 is ignored)
    assert m["rollout/probs_diff_mean"] == pytest.approx(0.95 / 5)
    assert m["rollout/probs_diff_max"] == pytest.approx(0.5)
    # row 0: (ln .25 + ln .9 + ln .4 - ln .5 - ln .9 - ln .2)/3 = (ln .5 + ln 2)/3 = 0; row 1: ln(.1/.6)/2
    assert m["rollout/log_ppl_diff"] == pytest.approx((0.0 + math.log(0.1 / 0.6) / 2) / 2)


def test_tis_rejects_bad_cap():
    with pytest.raises(ValueError, match="cap"):
        compute_tis_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cap=0.0)
