"""verl 0.9's rollout-correction family and the settings of the new losses: hand-computed weights and masks, and the
configuration errors and on-policy rule of their ``worker.actor`` keys (values against verl itself are in
``tests/test_verl_parity.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from easyrl.algorithms.advantages import ADV_ESTIMATORS, AdvantageInputs
from easyrl.algorithms.rollout_correction import (
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
    correct_rollout,
)
from easyrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
BASE = [f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m"]
D = torch.float64
LOG_RATIO = torch.tensor([[math.log(0.5), math.log(1.5), math.log(3.0)], [math.log(1.2), 0.0, 9.0]], dtype=D)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)


def test_token_tis_and_icepop():
    weights, metrics = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 1.5, 2.0], [1.2, 1.0, 0.0]], dtype=D))
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == 0.0  # 0.5 is not below 1 / 2
    icepop, _ = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0, threshold_lower=0.8)
    torch.testing.assert_close(icepop, torch.tensor([[0.0, 1.5, 0.0], [1.2, 1.0, 0.0]], dtype=D))  # zeroed, not cut


def test_sequence_is_is_the_product_of_the_token_ratios():
    weights, _ = compute_rollout_correction_weights(LOG_RATIO, MASK, "sequence", 10.0)
    torch.testing.assert_close(weights, torch.tensor([[2.25] * 3, [1.2, 1.2, 0.0]], dtype=D))  # 0.5*1.5*3, 1.2*1


def test_rejection_sampling_token_and_sequence():
    # k1 = -log_ratio = log(pi_rollout / pi_old) must lie in [log 0.6, log 2.5]: the ratio 3 (k1 = log 1/3) leaves
    mask, metrics = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", "0.6_2.5")
    torch.testing.assert_close(mask, torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=D))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 5)
    # seq_max_k2: max x^2/2 of row 0 is log(3)^2/2 = 0.60, of row 1 log(1.2)^2/2 = 0.017 (the padded 9 is ignored)
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_max_k2", 0.5)
    torch.testing.assert_close(mask, torch.tensor([[0, 0, 0], [1, 1, 0]], dtype=D))
    with pytest.raises(ValueError, match="seq_max_k1"):
        compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_max_k1", 0.5)


def test_correct_rollout_prefers_tis_cap_and_applies_the_rejection_mask():
    old = torch.zeros(2, 3, dtype=D)
    weights, mask, metrics = correct_rollout(old, -LOG_RATIO, MASK, tis_cap=2.0, rollout_rs="token_k1",
                                             rollout_rs_threshold="0.6_2.5")
    assert "rollout/tis_weight_mean" in metrics and "rollout_corr/rollout_rs_masked_fraction" in metrics
    torch.testing.assert_close(mask, torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=D))
    assert weights[0, 2] == 2.0


def test_opo_and_gpg_hand_values():
    rewards = torch.tensor([[0, 1.0, 0], [0, 0, 0], [0, 0, 2.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=D)
    inputs = AdvantageInputs(rewards, mask, np.array(["a", "a", "b"], dtype=object))
    opo, _ = ADV_ESTIMATORS.get("opo")(inputs)
    # group a: lengths 2, 1, scores 1, 0 -> baseline 2/3; group b alone: baseline 0
    torch.testing.assert_close(opo[:, 0], torch.tensor([1 / 3, -2 / 3, 2.0], dtype=D))
    gpg, _ = ADV_ESTIMATORS.get("gpg")(inputs)
    # alpha = 3 samples / 2 non-zero scores; group a mean 1/2, group b (one sample) mean 0
    torch.testing.assert_close(gpg[:, 0], 1.5 * torch.tensor([0.5, -0.5, 2.0], dtype=D))


@pytest.mark.parametrize("overrides, words", [
    (["worker.rollout.calculate_log_probs=false", "worker.actor.rollout_is=token"],
     ["worker.actor.rollout_is", "calculate_log_probs"]),
    (["worker.rollout.calculate_log_probs=false", "worker.actor.loss_type=bypass_mode"],
     ["bypass_mode", "calculate_log_probs"]),
    (["worker.rollout.calculate_log_probs=true", "worker.actor.rollout_is=tokens"], ["rollout_is", "tokens"]),
    (["worker.rollout.calculate_log_probs=true", "worker.actor.rollout_is=token", "worker.actor.tis_cap=2.0"],
     ["tis_cap", "rollout_is"]),
    (["worker.rollout.calculate_log_probs=true", "worker.actor.rollout_rs=token_k1"], ["rollout_rs_threshold"]),
    (["worker.rollout.calculate_log_probs=true", "worker.actor.rollout_rs=seq_max_k1",
      "worker.actor.rollout_rs_threshold=0.1"], ["seq_max_k1"]),
    (["worker.rollout.calculate_log_probs=true", "worker.actor.rollout_rs=token_k2",
      "worker.actor.rollout_rs_threshold=-1"], ["rollout_rs_threshold"]),
    (["worker.actor.rollout_is_threshold_lower=3.0"], ["rollout_is_threshold_lower"]),
    (["worker.actor.loss_type=dro"], ["dro_beta"]),
    (["worker.actor.clip_cov_ratio=0"], ["clip_cov_ratio"]),
    (["algorithm.adv_estimator=optimal_token_baseline"], ["optimal_token_baseline", "sum_v pi(v)^2"]),
])
def test_config_errors(expect_user_error, overrides, words):
    expect_user_error(lambda: load_config([*BASE, *overrides]), "config", *words)


def test_valid_settings_load_and_rollout_correction_needs_old_log_probs():
    config = load_config([*BASE, "worker.rollout.calculate_log_probs=true", "worker.actor.rollout_is=sequence",
                          "worker.actor.rollout_rs=token_k1,seq_mean_k3", "worker.actor.rollout_rs_threshold=0.5_2,0.1",
                          "worker.actor.loss_type=dro", "worker.actor.dro_beta=0.5"])
    assert config.worker.actor.rollout_rs_threshold == "0.5_2,0.1"
    config.worker.actor.ppo_epochs, config.worker.actor.global_batch_size = 1, config.data.rollout_batch_size
    assert not config.on_policy_update  # the IS weights and the rejection mask compare old and rollout log-probs
    config.worker.actor.rollout_is = None
    assert not config.on_policy_update
    config.worker.actor.rollout_rs = None
    assert config.on_policy_update


def test_the_sync_gap_is_a_median_that_outlier_tokens_cannot_move():
    from easyrl.algorithms.rollout_correction import log_prob_diff_median

    old = torch.zeros(4, 8)
    mask = torch.ones(4, 8)
    mask[:, 6:] = 0
    rollout = old + 1e-3
    rollout[0, :3] -= 5.0  # 3 of 24 valid tokens far off (bf16 on low-probability tokens): the median stays
    rollout[:, 6:] = 9.0  # padding is ignored
    assert log_prob_diff_median(old, rollout, mask) == pytest.approx(1e-3)
    assert log_prob_diff_median(old, old - 0.3 * mask, mask) == pytest.approx(0.3)  # most tokens moved
    assert log_prob_diff_median(old, rollout, torch.zeros(4, 8)) == 0.0


@pytest.mark.parametrize("overrides, threshold", [
    ([], 0.1),
    (["worker.actor.rollout_sync_threshold=0.5"], 0.5),
    (["worker.actor.rollout_sync_threshold=null"], None),
    (["worker.rollout.calculate_log_probs=false"], None),
    (["worker.rollout.top_p=0.9"], None),  # vLLM reports the truncated distribution's log-probs
    (["worker.rollout.top_k=20"], None),
])
def test_the_sync_check_is_on_by_default_where_the_distributions_agree(overrides, threshold):
    assert load_config([*BASE, *overrides]).sync_check_threshold == threshold


def test_the_sync_threshold_must_be_positive(expect_user_error):
    expect_user_error(lambda: load_config([*BASE, "worker.actor.rollout_sync_threshold=0"]), "config",
                      "worker.actor.rollout_sync_threshold")
