"""DAPO dynamic-sampling group filter against hand-worked groups."""

import numpy as np
import pytest
import torch

from easyrl.algorithms.dynamic_sampling import select_groups

# Interleaved groups:
#   a: 1 1 1   -> all equal (always solved)         -> dropped
#   b: 0 1 0   -> mixed, mean 1/3                    -> kept (unless bounds exclude 1/3)
#   c: 0 0     -> all equal (never solved)           -> dropped
#   d: 1       -> single sample, trivially all equal -> dropped
#   e: 1 1 0   -> mixed, mean 2/3
INDEX = np.array(["a", "b", "c", "a", "e", "b", "d", "a", "e", "c", "b", "e"], dtype=object)
VALUES = np.array([1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0], dtype=float)


def _kept_groups(keep):
    return sorted(set(INDEX[keep]))


def test_drops_groups_with_equal_values():
    keep = select_groups(VALUES, INDEX)
    assert keep.dtype == bool and keep.shape == (12,)
    assert _kept_groups(keep) == ["b", "e"]
    # every sample of a kept group is kept
    assert keep.tolist() == [g in ("b", "e") for g in INDEX]


@pytest.mark.parametrize(
    "low, high, groups",
    [
        (0.5, None, ["e"]),  # b's mean 1/3 < 0.5
        (None, 0.5, ["b"]),  # e's mean 2/3 > 0.5
        (0.3, 0.7, ["b", "e"]),
        (1 / 3, 2 / 3, ["b", "e"]),  # bounds are inclusive
        (0.4, 0.6, []),
    ],
)
def test_mean_bounds(low, high, groups):
    assert _kept_groups(select_groups(VALUES, INDEX, filter_low=low, filter_high=high)) == groups


def test_accepts_tensor_values():
    keep = select_groups(torch.tensor(VALUES, dtype=torch.float32), INDEX)
    assert _kept_groups(keep) == ["b", "e"]


def test_continuous_values():
    # g: 0.5 0.5 -> dropped; h: 0.2 0.3 -> kept
    keep = select_groups(np.array([0.5, 0.2, 0.5, 0.3]), np.array(["g", "h", "g", "h"]))
    assert keep.tolist() == [False, True, False, True]


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="values and index"):
        select_groups(VALUES[:5], INDEX)
    with pytest.raises(ValueError, match="filter_low"):
        select_groups(VALUES, INDEX, filter_low=0.9, filter_high=0.1)


def test_empty_batch():
    assert select_groups(np.zeros(0), np.array([], dtype=object)).shape == (0,)
