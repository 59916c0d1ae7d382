"""Karmarkar-Karp balancing across ranks and token-budget micro-batches: every sample exactly once, balanced sums."""

from __future__ import annotations

import random

import pytest

from easyrl.workers.seqlen_balancing import (
    balanced_rank_order,
    count_micro_batches,
    dynamic_micro_batches,
    karmarkar_karp,
)


def _sums(parts, lengths):
    return [sum(lengths[i] for i in part) for part in parts]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [2, 3, 8])
def test_equal_size_partition_is_exact_cover_and_balanced(seed, k):
    rng = random.Random(seed)
    lengths = [rng.randint(50, 2000) for _ in range(k * rng.randint(1, 12))]
    parts = karmarkar_karp(lengths, k, equal_size=True)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert {len(p) for p in parts} == {len(lengths) // k}
    sums = _sums(parts, lengths)
    # the consecutive split (what the trainer did before) for comparison: KK is never worse here
    naive = _sums([list(range(r * len(lengths) // k, (r + 1) * len(lengths) // k)) for r in range(k)], lengths)
    assert max(sums) - min(sums) <= max(naive) - min(naive)
    assert max(sums) - min(sums) <= max(lengths)


def test_known_instance():
    # the classic example: {8, 7, 6, 5, 4} -> KK gives {8, 6} / {7, 5, 4}, difference 2 (the optimum is 0)
    parts = karmarkar_karp([8, 7, 6, 5, 4], 2)
    assert sorted(_sums(parts, [8, 7, 6, 5, 4])) == [14, 16]
    # two long and two short samples over 2 ranks: each rank gets one long and one short
    order = balanced_rank_order([1000, 1000, 10, 10], 2)
    assert sorted(order) == [0, 1, 2, 3]
    assert {frozenset(order[:2]), frozenset(order[2:])} <= {frozenset({0, 2}), frozenset({0, 3}),
                                                             frozenset({1, 2}), frozenset({1, 3})}


def test_rank_order_rejects_uneven_batch():
    with pytest.raises(ValueError, match="cannot be split into 3 parts"):
        balanced_rank_order([1, 2, 3, 4], 3)


@pytest.mark.parametrize("seed", range(5))
def test_dynamic_micro_batches_respect_budget_and_cover(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(10, 300) for _ in range(rng.randint(1, 40))]
    budget = 400
    count = count_micro_batches(lengths, budget)
    assert count >= -(-sum(lengths) // budget)
    parts = dynamic_micro_batches(lengths, count)
    assert len(parts) == count and all(parts)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert max(_sums(parts, lengths)) <= budget
    # more micro-batches than needed (another rank needs more): still a non-empty exact cover
    extra = dynamic_micro_batches(lengths, min(len(lengths), count + 2))
    assert all(extra) and sorted(i for p in extra for i in p) == list(range(len(lengths)))


def test_micro_batch_budget_errors():
    with pytest.raises(ValueError, match="max_token_len_per_device=100"):
        count_micro_batches([50, 101], 100)
    with pytest.raises(ValueError, match="must lie in"):
        dynamic_micro_batches([1, 2], 3)
