"""Advantage estimators against hand-computed values and independent plain-Python loops."""

import math
import random
import statistics

import numpy as np
import pytest
import torch

from easyrl.algorithms.advantages import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    compute_advantage,
    group_statistics,
)

EPS = 1e-6
SQRT2 = math.sqrt(2.0)


def _mask(lengths, resp_len):
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(resp_len)] for n in lengths], dtype=torch.float64)


def _advantage(name, rewards, mask, index, **settings):
    """``(advantages, returns)`` of the estimator ``name``; ``settings``: the other fields of AdvantageInputs."""
    return compute_advantage(name, AdvantageInputs(rewards, mask, index, **settings))


def _random_groups(rng, bsz, resp_len, n_groups, prefix):
    """``(index, lengths, mask)`` of ``bsz`` samples in up to ``n_groups`` random groups, random lengths."""
    index = np.array([f"{prefix}{rng.randrange(n_groups)}" for _ in range(bsz)], dtype=object)
    lengths = [rng.randint(1, resp_len) for _ in range(bsz)]
    return index, lengths, _mask(lengths, resp_len)


# Batch used by the outcome-reward tests: 6 samples, groups interleaved, uneven lengths.
#   sample : 0    1    2    3    4    5
#   uid    : a    b    a    a    b    c      (c has a single sample)
#   length : 3    1    4    2    2    3
#   score  : 1    0    3    2    4    5
# Sample 2 has its score split over two tokens (1 + 2); sample 1 has a reward of 100 on a padding token,
# which must be ignored.
INDEX = np.array(["a", "b", "a", "a", "b", "c"], dtype=object)
LENGTHS = [3, 1, 4, 2, 2, 3]
MASK = _mask(LENGTHS, 4)


def _rewards():
    r = torch.zeros(6, 4, dtype=torch.float64)
    r[0, 2] = 1.0
    r[1, 0] = 0.0
    r[1, 3] = 100.0  # padding: ignored
    r[2, 0], r[2, 3] = 1.0, 2.0
    r[3, 1] = 2.0
    r[4, 1] = 4.0
    r[5, 2] = 5.0
    return r


def _expected(per_sample):
    return torch.tensor(per_sample, dtype=torch.float64).unsqueeze(-1) * MASK


# group a = {1, 3, 2}: mean 2, unbiased std sqrt((1 + 1 + 0) / 2) = 1
# group b = {0, 4}:    mean 2, unbiased std sqrt((4 + 4) / 1) = 2*sqrt(2)
# group c = {5}:       single sample -> mean 0, std 1


def test_grpo_hand_values():
    adv, ret = _advantage("grpo", _rewards(), MASK, INDEX, epsilon=EPS)
    expected = _expected(
        [
            (1 - 2) / (1 + EPS),
            (0 - 2) / (2 * SQRT2 + EPS),
            (3 - 2) / (1 + EPS),
            (2 - 2) / (1 + EPS),
            (4 - 2) / (2 * SQRT2 + EPS),
            (5 - 0) / (1 + EPS),
        ]
    )
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_drgrpo_hand_values():
    adv, _ = _advantage("grpo", _rewards(), MASK, INDEX, norm_adv_by_std_in_grpo=False)
    # score - group mean, no std division: 1-2, 0-2, 3-2, 2-2, 4-2, 5-0
    torch.testing.assert_close(adv, _expected([-1.0, -2.0, 1.0, 0.0, 2.0, 5.0]))


def test_drgrpo_switch_changes_exactly_the_std_division():
    rng = random.Random(0)
    bsz, resp_len = 24, 7
    index, lengths, mask = _random_groups(rng, bsz, resp_len, n_groups=5, prefix="uid")
    rewards = torch.zeros(bsz, resp_len, dtype=torch.float64)
    for i, n in enumerate(lengths):
        rewards[i, n - 1] = float(rng.randint(0, 3))
    grpo, _ = _advantage("grpo", rewards, mask, index, epsilon=EPS)
    dr, _ = _advantage("grpo", rewards, mask, index, epsilon=EPS, norm_adv_by_std_in_grpo=False)
    for uid in set(index):
        rows = [i for i in range(bsz) if index[i] == uid]
        scores = torch.tensor([float(rewards[i].sum()) for i in rows], dtype=torch.float64)
        std = float(scores.std()) if len(rows) > 1 else 1.0
        for i in rows:
            torch.testing.assert_close(dr[i], grpo[i] * (std + EPS))


def test_grpo_vectorised_equals_plain_loop():
    rng = random.Random(1)
    bsz, resp_len = 64, 5
    index, lengths, mask = _random_groups(rng, bsz, resp_len, n_groups=9, prefix="p")
    rewards = torch.tensor([[rng.random() for _ in range(resp_len)] for _ in range(bsz)], dtype=torch.float64)
    adv, _ = _advantage("grpo", rewards, mask, index, epsilon=EPS)

    scores = [sum(float(rewards[i, t]) for t in range(lengths[i])) for i in range(bsz)]
    for i in range(bsz):
        group = [scores[j] for j in range(bsz) if index[j] == index[i]]
        mean, std = (statistics.mean(group), statistics.stdev(group)) if len(group) > 1 else (0.0, 1.0)
        value = (scores[i] - mean) / (std + EPS)
        for t in range(resp_len):
            assert adv[i, t].item() == pytest.approx(value if t < lengths[i] else 0.0, abs=1e-12)


def test_group_statistics():
    scores = torch.tensor([1.0, 0.0, 3.0, 2.0, 4.0, 5.0], dtype=torch.float64)
    gid, count, mean, std = group_statistics(scores, INDEX)
    assert gid.tolist() == [0, 1, 0, 0, 1, 2]  # np.unique sorts a < b < c
    assert count.tolist() == [3, 2, 3, 3, 2, 1]
    torch.testing.assert_close(mean, torch.tensor([2.0, 2.0, 2.0, 2.0, 2.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(std, torch.tensor([1, 2 * SQRT2, 1, 1, 2 * SQRT2, 1], dtype=torch.float64))


def test_rloo_hand_values():
    adv, ret = _advantage("rloo", _rewards(), MASK, INDEX)
    # a = {s0: 1, s2: 3, s3: 2}: 1 - (3+2)/2 = -1.5, 3 - (1+2)/2 = 1.5, 2 - (1+3)/2 = 0
    # b = {s1: 0, s4: 4}: 0 - 4 = -4, 4 - 0 = 4;  c = {s5: 5}: no other sample, baseline 0 -> 5
    expected = _expected([-1.5, -4.0, 1.5, 0.0, 4.0, 5.0])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_reinforce_plus_plus_hand_values():
    # gamma = 0.5
    # row 0: mask 1 1 1, rewards 1 0 2 -> G2 = 2, G1 = 0 + .5*2 = 1, G0 = 1 + .5*1 = 1.5
    # row 1: mask 1 1 0, rewards 0 4 9(padding, ignored) -> G2 = 0, G1 = 4, G0 = 0 + .5*4 = 2
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]], dtype=torch.float64)
    mask = _mask([3, 2], 3)
    adv, ret = _advantage("reinforce_plus_plus", rewards, mask, np.array(["x", "y"]), gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]], dtype=torch.float64))
    # valid returns 1.5 1 2 2 4: mean 10.5/5 = 2.1; squared deviations .36 1.21 .01 .01 3.61 = 5.2;
    # unbiased var 5.2/4 = 1.3
    std = math.sqrt(1.3 + 1e-8)
    expected = torch.tensor([[-0.6, -1.1, -0.1], [-0.1, 1.9, 0.0]], dtype=torch.float64) / std
    torch.testing.assert_close(adv, expected * mask)


def test_reinforce_plus_plus_masked_hole_passes_return_through():
    # mask 1 0 1, rewards 1 7 2, gamma .5: G2 = 2; t=1 masked -> return 0, passes 2 on; G0 = 1 + .5*2 = 2
    rewards = torch.tensor([[1.0, 7.0, 2.0], [3.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    _, ret = _advantage("reinforce_plus_plus", rewards, mask, np.array(["x", "y"]), gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[2.0, 0.0, 2.0], [3.0, 0.0, 0.0]], dtype=torch.float64))


def test_reinforce_plus_plus_baseline_matches_loop():
    adv, ret = _advantage("reinforce_plus_plus_baseline", _rewards(), MASK, INDEX)
    # score - group mean (single-sample group: mean 0): -1, -2, 1, 0, 2, 5, repeated over each valid token
    centred = [-1.0, -2.0, 1.0, 0.0, 2.0, 5.0]
    tokens = [centred[i] for i in range(6) for _ in range(LENGTHS[i])]
    mean, var = statistics.mean(tokens), statistics.variance(tokens)  # unbiased
    expected = _expected([(c - mean) / math.sqrt(var + 1e-8) for c in centred])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_remax_hand_values():
    # row 0: rewards 1 0 2, mask 1 1 1, baseline 1.5 -> returns 3 2 2, adv 1.5 .5 .5
    # row 1: rewards 0 4 9(padding), mask 1 1 0, baseline 5 -> returns 4 4 0, adv -1 -1 0
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]], dtype=torch.float64)
    mask = _mask([3, 2], 3)
    baselines = torch.tensor([1.5, 5.0], dtype=torch.float64)
    adv, ret = _advantage("remax", rewards, mask, np.array(["x", "y"]), reward_baselines=baselines)
    torch.testing.assert_close(ret, torch.tensor([[3.0, 2.0, 2.0], [4.0, 4.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(adv, torch.tensor([[1.5, 0.5, 0.5], [-1.0, -1.0, 0.0]], dtype=torch.float64))


def test_remax_without_baselines_raises():
    with pytest.raises(ValueError, match="reward_baselines"):
        _advantage("remax", _rewards(), MASK, INDEX)


def test_grpo_passk_hand_values():
    # groups a = {s0: 1, s2: 3, s3: 2}, b = {s1: 0, s4: 4}; the single-sample group c is left out
    rewards, mask, index = _rewards()[:5], MASK[:5], INDEX[:5]
    adv, _ = _advantage("grpo_passk", rewards, mask, index, epsilon=EPS)
    # a: best s2, 3 - 2 = 1, / (std 1 + eps);  b: best s4, 4 - 0 = 4, / (2 sqrt 2 + eps); others 0
    expected = torch.tensor([0, 0, 1 / (1 + EPS), 0, 4 / (2 * SQRT2 + EPS)], dtype=torch.float64)
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)
    adv_raw, _ = _advantage("grpo_passk", rewards, mask, index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv_raw, torch.tensor([0, 0, 1.0, 0, 4.0], dtype=torch.float64).unsqueeze(-1) * mask)


def test_grpo_passk_tie_gives_zero():
    # group {1, 1, 0}: max 1, second max 1 -> the best sample's advantage is 0, all are 0
    rewards = torch.tensor([[1.0], [1.0], [0.0]], dtype=torch.float64)
    adv, _ = _advantage("grpo_passk", rewards, torch.ones(3, 1), np.array(["g", "g", "g"]))
    assert adv.abs().sum().item() == 0.0


def test_grpo_passk_single_sample_group_raises():
    with pytest.raises(ValueError, match="'c'"):
        _advantage("grpo_passk", _rewards(), MASK, INDEX)


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"])
def test_zero_outside_mask_and_float32(name):
    rewards = _rewards().float() + 0.5  # non-zero everywhere, including padding
    baselines = torch.ones(6)
    adv, ret = _advantage(name, rewards, MASK.float(), INDEX, gamma=0.9, reward_baselines=baselines)
    assert adv.dtype == torch.float32 and adv.shape == (6, 4)
    assert torch.all(adv[MASK == 0] == 0) and torch.all(ret[MASK == 0] == 0)


def test_unknown_estimator_lists_names():
    with pytest.raises(ValueError) as err:
        ADV_ESTIMATORS.get("gae_typo")
    for name in ADV_ESTIMATORS:
        assert name in str(err.value)
    assert set(ADV_ESTIMATORS) >= {"grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
                                   "grpo_passk"}


def test_bad_index_length_raises():
    with pytest.raises(ValueError, match="index"):
        _advantage("grpo", _rewards(), MASK, INDEX[:5])


def test_inputs_check_shapes_at_construction():
    with pytest.raises(ValueError, match="response_mask"):
        AdvantageInputs(_rewards(), MASK[:, :3], INDEX)
    with pytest.raises(ValueError, match="reward_baselines"):
        AdvantageInputs(_rewards(), MASK, INDEX, reward_baselines=torch.ones(5))
    with pytest.raises(ValueError, match="values"):
        AdvantageInputs(_rewards(), MASK, INDEX, values=torch.ones(6, 3))
