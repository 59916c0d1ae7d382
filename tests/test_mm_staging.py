"""Multi-modal inputs staged on a worker once per step: the passes' shares get them back, stale ones are refused."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.trainer.rollout import for_workers
from easyrl.workers.mm_staging import (
    STAGE_KEY,
    MultiModalStage,
    has_multi_modal,
    multi_modal_nbytes,
    stage_references,
    staging_batch,
)


def _batch(n: int = 4) -> Batch:
    tensors = TensorDict({"input_ids": torch.arange(n * 3).view(n, 3)}, batch_size=[n])
    inputs = [{"pixel_values": torch.full((2 + i, 5), float(i)), "image_grid_thw": torch.tensor([[1, 1, 2 + i]])}
              if i % 2 == 0 else {} for i in range(n)]  # an image prompt, a text prompt, ...
    return Batch(tensors, {"multi_modal_inputs": inputs, "images": [["img"]] * n})


def _stage_shares(batch: Batch, world: int, token: str) -> tuple[list[MultiModalStage], list[tuple[str, int]]]:
    refs = stage_references(len(batch), token)
    stages = [MultiModalStage() for _ in range(world)]
    for stage, share in zip(stages, staging_batch(batch, refs).chunk(world)):
        stage.stage(share)
    return stages, refs


def test_each_pass_gets_its_shares_staged_inputs_back_and_only_one_copy_is_counted():
    batch = _batch(4)
    stages, refs = _stage_shares(batch, 2, "step1")
    sent = for_workers(batch, refs)
    assert set(sent.extras) == {STAGE_KEY}  # neither pixel_values nor PIL images travel with the passes
    for _ in range(3):  # old log-probs, ref log-probs, update
        for rank, (stage, share) in enumerate(zip(stages, sent.chunk(2))):
            got = stage.attach(share)
            assert STAGE_KEY not in got.extras
            assert torch.equal(got["input_ids"], batch["input_ids"][2 * rank: 2 * rank + 2])
            want = batch["multi_modal_inputs"][2 * rank: 2 * rank + 2]
            assert [sorted(d) for d in got["multi_modal_inputs"]] == [sorted(d) for d in want]
            for a, b in zip(got["multi_modal_inputs"], want):
                assert all(torch.equal(a[k], b[k]) for k in b)
    received = sum(stage.release() for stage in stages)
    assert received == multi_modal_nbytes(batch["multi_modal_inputs"]) == (2 * 5 + 4 * 5) * 4 + 2 * 3 * 8  # fp32 pixels, int64 grids
    assert all(stage.inputs is None and stage.release() == 0 for stage in stages)  # freed, counter reset


def test_unstaged_shares_pass_through_and_count_what_they_carry():
    batch = _batch(2)
    stage = MultiModalStage()
    got = stage.attach(for_workers(batch))
    assert got["multi_modal_inputs"] is batch["multi_modal_inputs"]
    assert stage.release() == multi_modal_nbytes(batch["multi_modal_inputs"]) > 0


@pytest.mark.parametrize("case, message", [
    ("other_step", "another step's"),
    ("other_count", "for 2 samples but the share has 4"),
    ("other_share", "other samples of this step"),
    ("released", "none are staged"),
])
def test_stale_or_mismatched_staged_inputs_are_refused(case, message):
    batch = _batch(4)
    stages, refs = _stage_shares(batch, 2, "step1")
    if case == "other_step":
        share = for_workers(batch, stage_references(4, "step2")).chunk(2)[0]
    elif case == "other_count":
        share = for_workers(batch, refs)
    elif case == "other_share":
        share = for_workers(batch, refs).chunk(2)[1]
    else:
        stages[0].release()
        share = for_workers(batch, refs).chunk(2)[0]
    with pytest.raises(RuntimeError, match=message):
        stages[0].attach(share)


def test_text_only_batches_stage_nothing_and_step_tokens_differ():
    text = Batch(TensorDict({}, batch_size=[2]), {"multi_modal_inputs": [{}, {}]})
    assert not has_multi_modal(text) and not has_multi_modal(Batch(TensorDict({}, batch_size=[2])))
    assert has_multi_modal(_batch(2))
    assert stage_references(2)[0][0] != stage_references(2)[0][0]
