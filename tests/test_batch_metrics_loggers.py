"""The batch container, the standard metrics and the metric loggers, on hand-made data."""

from __future__ import annotations

import json

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.trainer.loggers import Tracker
from easyrl.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    reduce_metrics,
)


def _batch(n=4):
    tensors = TensorDict({"x": torch.arange(n * 2).view(n, 2)}, batch_size=[n])
    return Batch(tensors, {"uid": [f"u{i // 2}" for i in range(n)], "gt": list("abcd"[:n])})


def test_batch_select_split_chunk_cat():
    b = _batch()
    picked = b.select([3, 0])
    assert picked["x"].tolist() == [[6, 7], [0, 1]] and picked["gt"] == ["d", "a"]
    halves = b.chunk(2)
    assert [h["gt"] for h in halves] == [["a", "b"], ["c", "d"]]
    assert [len(p) for p in b.split(3)] == [3, 1]
    again = Batch.cat(halves)
    assert torch.equal(again["x"], b["x"]) and again["uid"] == b["uid"]
    with pytest.raises(ValueError, match="4 samples cannot be split into 3"):
        b.chunk(3)
    with pytest.raises(ValueError, match="Extra 'gt' has 2 entries for a batch of 4"):
        b["gt"] = ["a", "b"]


def test_data_metrics_by_hand():
    # 2 samples, prompt width 3 (left-padded), response width 4 (right-padded)
    attention = torch.tensor([[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    scores = torch.tensor([[0, 1.0, 0, 0], [0, 0, 0, 0.5]])
    batch = Batch(TensorDict({
        "prompts": torch.zeros(2, 3), "attention_mask": attention, "response_mask": response_mask,
        "token_level_scores": scores, "token_level_rewards": scores - 0.25 * response_mask,
        "advantages": torch.tensor([[2.0, 2.0, 9, 9], [-1.0, -1, -1, -1]]),
        "returns": torch.tensor([[1.0, 1.0, 0, 0], [0.5, 0.5, 0.5, 0.5]]),
    }, batch_size=[2]))
    m = compute_data_metrics(batch, max_prompt_length=3, max_response_length=4)
    assert m["critic/score/mean"] == pytest.approx(0.75) and m["critic/score/max"] == 1.0
    assert m["critic/rewards/min"] == pytest.approx(0.5 - 1.0)  # 0.5 - 4 * 0.25
    # advantages over valid tokens only: (2 + 2 - 4) / 6 = 0; the 9s at padding are ignored
    assert m["critic/advantages/mean"] == pytest.approx(0.0) and m["critic/advantages/max"] == 2.0
    assert m["response_length/mean"] == 3.0 and m["response_length/clip_ratio"] == 0.5
    assert m["prompt_length/min"] == 2.0 and m["prompt_length/clip_ratio"] == 0.5
    perf = compute_throughput_metrics(batch, step_seconds=2.0, world_size=2)
    assert perf["perf/total_num_tokens"] == 11 and perf["perf/throughput"] == pytest.approx(11 / 2 / 2)
    assert reduce_metrics({"a": [1.0, 2.0, 6.0]}) == {"a": 3.0}
    assert "critic/values/mean" not in m
    # with a critic: values over the 6 valid tokens; returns 1 1 | .5 .5 .5 .5 minus values .5 .5 | 0 0 0 1
    batch["values"] = torch.tensor([[0.5, 0.5, 7, 7], [0.0, 0, 0, 1]])
    m = compute_data_metrics(batch, max_prompt_length=3, max_response_length=4)
    assert m["critic/values/max"] == 1.0 and m["critic/values/mean"] == pytest.approx(2.0 / 6)
    # R - V = .5 .5 .5 .5 .5 -.5: var (unbiased) = 1/6; var(R) = (4 * (1/6)^2 + 2 * (1/3)^2) ... = 1/15
    residual, returns = torch.tensor([0.5] * 5 + [-0.5]), torch.tensor([1.0, 1, 0.5, 0.5, 0.5, 0.5])
    assert residual.var().item() == pytest.approx(1 / 6) and returns.var().item() == pytest.approx(1 / 15)
    assert m["critic/vf_explained_var"] == pytest.approx(1 - (1 / 6) / (1 / 15 + 1e-5))


def test_tracker_jsonl_and_tensorboard(tmp_path):
    tracker = Tracker(["jsonl", "tensorboard", "console"], str(tmp_path), "p", "e", {})
    tracker.log({"actor/pg_loss": 0.5, "bad": float("nan")}, step=1)
    tracker.log({"actor/pg_loss": 0.25}, step=2)
    tracker.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "actor/pg_loss": 0.5, "bad": "nan"}, {"step": 2, "actor/pg_loss": 0.25}]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    with pytest.raises(ValueError, match="unknown backend 'neptune'"):
        Tracker(["neptune"], str(tmp_path), "p", "e", {})
