"""Sequence-length balancing from token counts alone: :func:`balanced_rank_order` permutes a batch so its equal
consecutive shares carry about equal tokens (equal sample counts kept); :func:`dynamic_micro_batches` forms
micro-batches by a token budget (``worker.actor.max_token_len_per_device``), as many on every rank.

Both use the largest differencing method of Karmarkar and Karp ("The differencing method of set partitioning",
1982), generalised to k parts (Michiels, Korst, Aarts, "Multi-way number partitioning", 2003).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

__all__ = ["karmarkar_karp", "balanced_rank_order", "count_micro_batches", "dynamic_micro_batches"]


def karmarkar_karp(lengths: Sequence[int], k: int, equal_size: bool = False) -> list[list[int]]:
    """Partition sample indices into ``k`` sorted parts with nearly equal sums of ``lengths`` (tokens; largest
    differencing: repeatedly merge the two k-subset states of largest spread, heaviest subset with lightest). With
    ``equal_size`` every part gets exactly ``n / k`` samples; else none is empty when ``n >= k``. Raises
    ``ValueError`` for ``k < 1``, a negative length, or ``equal_size`` with ``n`` not divisible by ``k``."""
    n = len(lengths)
    if k < 1:
        raise ValueError(f"karmarkar_karp: k must be >= 1, got {k}")
    if any(x < 0 for x in lengths):
        raise ValueError("karmarkar_karp: lengths must be >= 0")
    if equal_size and n % k != 0:
        raise ValueError(f"karmarkar_karp: {n} samples cannot be split into {k} parts of equal size")
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    counter = 0  # tie-breaker so that heapq never compares the subsets

    def push(subsets: list[tuple[int, list[int]]]) -> None:
        nonlocal counter
        subsets.sort(key=lambda s: s[0])
        heapq.heappush(heap, (-(subsets[-1][0] - subsets[0][0]), counter, subsets))
        counter += 1

    if equal_size:
        for start in range(0, n, k):
            push([(lengths[i], [i]) for i in order[start:start + k]])
    else:
        for i in order:
            push([(lengths[i], [i])] + [(0, []) for _ in range(k - 1)])
    if not heap:
        return [[] for _ in range(k)]
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)  # both sorted by sum ascending: pair a's lightest with b's heaviest
        push([(a[i][0] + b[k - 1 - i][0], a[i][1] + b[k - 1 - i][1]) for i in range(k)])
    parts = [sorted(indices) for _, indices in heap[0][2]]
    for part in parts if not equal_size else []:  # an empty part takes one sample of the most populated one
        donor = max(parts, key=len)
        if not part and len(donor) >= 2:
            part.append(donor.pop())
    return parts


def balanced_rank_order(lengths: Sequence[int], world_size: int) -> list[int]:
    """A permutation of the batch whose ``world_size`` equal consecutive shares have nearly equal token sums:
    ``batch.select(order).chunk(world_size)[r]`` is rank ``r``'s share. ``lengths``: ``(bsz,)`` tokens per sample.
    Raises ``ValueError`` when ``bsz`` is not divisible by ``world_size``."""
    return [i for part in karmarkar_karp(lengths, world_size, equal_size=True) for i in part]


def count_micro_batches(lengths: Sequence[int], max_tokens: int) -> int:
    """How many micro-batches of at most ``max_tokens`` tokens ``lengths`` needs: from ``ceil(sum / max_tokens)`` up
    until the Karmarkar-Karp partition fits. Raises ``ValueError`` for a sample longer than ``max_tokens``."""
    if max_tokens < 1:
        raise ValueError(f"max_token_len_per_device must be >= 1, got {max_tokens}")
    longest = max(lengths, default=0)
    if longest > max_tokens:
        raise ValueError(
            f"A sample of {longest} tokens exceeds worker.actor.max_token_len_per_device={max_tokens}: set it to at "
            "least data.max_prompt_length + data.max_response_length."
        )
    count = max(1, math.ceil(sum(lengths) / max_tokens))
    while count < len(lengths):
        parts = karmarkar_karp(lengths, count)
        if max(sum(lengths[i] for i in part) for part in parts) <= max_tokens:
            break
        count += 1
    return count


def dynamic_micro_batches(lengths: Sequence[int], num_micro_batches: int) -> list[list[int]]:
    """Split a rank's samples (``lengths``: ``(bsz,)`` tokens each) into ``num_micro_batches`` non-empty lists of
    indices of nearly equal token sums, heaviest first. Raises ``ValueError`` outside ``[1, bsz]``."""
    if not 1 <= num_micro_batches <= max(1, len(lengths)):
        raise ValueError(f"num_micro_batches={num_micro_batches} must lie in [1, {len(lengths)}] (the samples)")
    parts = karmarkar_karp(lengths, num_micro_batches)
    return sorted(parts, key=lambda part: -sum(lengths[i] for i in part))
