"""``Batch.padded_to_multiple``: the padding ``Generator.generate_even`` and ``ModelRewards.run`` share."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch


def _batch(n: int) -> Batch:
    tensors = TensorDict({"x": torch.arange(n * 2).view(n, 2)}, batch_size=[n])
    return Batch(tensors, {"gt": [f"g{i}" for i in range(n)]})


@pytest.mark.parametrize("n, k, expected", [
    (5, 4, [0, 1, 2, 3, 4, 0, 1, 2]),  # copies of the first samples
    (2, 7, [0, 1, 0, 1, 0, 1, 0]),  # fewer samples than copies needed: wraps around
    (4, 2, [0, 1, 2, 3]),  # a multiple already
    (3, 1, [0, 1, 2]),
])
def test_padded_to_multiple_appends_the_first_samples(n, k, expected):
    batch = _batch(n)
    padded = batch.padded_to_multiple(k)
    assert len(padded) == len(expected) and len(padded) % k == 0
    assert padded["x"][:, 0].tolist() == [2 * i for i in expected]
    assert padded["gt"] == [f"g{i}" for i in expected]
    kept = padded.select(list(range(n)))  # how the callers drop the copies
    assert torch.equal(kept["x"], batch["x"]) and kept["gt"] == batch["gt"]
    if len(expected) == n:
        assert padded is batch  # nothing to add: the batch itself


def test_padded_to_multiple_empty_batch_and_bad_k():
    empty = _batch(0)
    assert empty.padded_to_multiple(4) is empty  # 0 is a multiple of every k
    with pytest.raises(ValueError, match="multiple of 0"):
        _batch(3).padded_to_multiple(0)


def test_without_drops_tensors_and_shares_the_rest():
    import torch
    from tensordict import TensorDict

    from easyrl.batch import Batch

    batch = Batch(TensorDict({"a": torch.ones(2), "b": torch.zeros(2)}, batch_size=[2]), {"uid": ["x", "y"]})
    less = batch.without("b", "absent")
    assert list(less.tensors.keys()) == ["a"] and less["a"] is batch["a"] and less["uid"] == ["x", "y"]
    assert "b" in batch  # the original keeps it
