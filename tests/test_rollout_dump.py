"""The rollout dump's format (``easyrl.trainer.rollout_dump``, docs/replay.md): a step's batch written and read back
bit for bit (every dtype and shape the update reads), extras as plain columns or JSON, multi-modal inputs by
reference (once per distinct tensor), readable with pandas and ``datasets``; the keep-last pruning; the writer the
trainer holds; the errors of a folder or step that is not there."""

from __future__ import annotations

import json
import os

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.trainer.rollout_dump import (
    RECOMPUTED,
    RolloutDump,
    describe_steps,
    dumped_steps,
    multi_modal_file,
    prune,
    read_step,
    replay_inputs,
    step_file,
    step_info,
    write_step,
)

BSZ, PROMPT, RESPONSE = 4, 3, 5


def _batch(seed: int = 0) -> Batch:
    """A scored batch of 4 samples (2 groups of 2) with the trainer's tensors and a few of every other kind."""
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "prompts": torch.randint(0, 1000, (BSZ, PROMPT), generator=g),
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [1, 1, 1]]),
        "responses": torch.randint(0, 1000, (BSZ, RESPONSE), generator=g),
        "response_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]),
        "rollout_log_probs": -torch.rand(BSZ, RESPONSE, generator=g),
        "old_log_probs": -torch.rand(BSZ, RESPONSE, generator=g, dtype=torch.float64),
        "token_level_scores": torch.zeros(BSZ, RESPONSE),
        "advantages": torch.randn(BSZ, RESPONSE, generator=g),
        "token_versions": torch.tensor([[0, 0, 1, -1, -1]] * BSZ),
        "reward_baselines": torch.rand(BSZ, generator=g),  # (bsz,): a plain column
        "position_ids": torch.randint(0, 8, (BSZ, 3, PROMPT + RESPONSE), generator=g),  # mrope: (bsz, 3, L)
        "half": torch.randn(BSZ, 2, generator=g).half(),
        "brain": torch.randn(BSZ, 2, generator=g).bfloat16(),
        "flags": torch.rand(BSZ, RESPONSE, generator=g) > 0.5,
        "empty": torch.zeros(BSZ, 0),
    }
    tensors["input_ids"] = torch.cat([tensors["prompts"], tensors["responses"]], dim=1)
    tensors["attention_mask"] = torch.cat([tensors["prompt_mask"], tensors["response_mask"]], dim=1)
    tensors["token_level_scores"][0, 2] = 1.0
    pixels = torch.randn(6, 4, generator=g)
    grid = torch.tensor([[1, 2, 3]])
    extras = {
        "uid": ["g0", "g0", "g1", "g1"],
        "score/overall": [1.0, 0.0, 0.5, 0.25],
        "weight_version": [3, 3, 2, 2],
        "ground_truth": ["4", "4", None, "x"],
        "columns": [{"prompt": "What is 2+2?", "level": 1}] * 2 + [{"prompt": "?", "level": [1, 2]}] * 2,
        "raw_prompt_ids": [[1, 2], [1, 2], [3], [3]],
        "multi_modal_inputs": [{"pixel_values": pixels, "image_grid_thw": grid}] * 2 + [{}, {}],
        "images": [["an image"]] * 2 + [[], []],
        "opaque": [object()] * BSZ,
    }
    return Batch(TensorDict(tensors, batch_size=[BSZ]), extras)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bfloat16:
        a, b = a.view(torch.int16), b.view(torch.int16)
    return torch.equal(a, b)


def test_a_step_round_trips_every_tensor_bit_for_bit(tmp_path):
    batch = _batch()
    path = write_step(str(tmp_path), 2, batch, {"actor/pg_loss": 0.25}, {"epoch": 0, "loader": {"n": 2}})
    assert path == step_file(str(tmp_path), 2) and os.path.basename(path) == "step_000002.parquet"
    back = read_step(str(tmp_path), 2)
    assert list(back.tensors.keys()) == list(batch.tensors.keys())
    for name in batch.tensors.keys():
        assert _same(back[name], batch[name]), name
    assert back["uid"] == batch["uid"] and back["score/overall"] == batch["score/overall"]
    assert back["weight_version"] == [3, 3, 2, 2] and back["ground_truth"] == ["4", "4", None, "x"]
    assert back["columns"] == batch["columns"] and back["raw_prompt_ids"] == batch["raw_prompt_ids"]
    info = step_info(str(tmp_path), 2)
    assert info["metrics"] == {"actor/pg_loss": 0.25} and info["prompt_position"] == {"epoch": 0, "loader": {"n": 2}}
    assert info["extras"]["uid"] == "plain" and info["extras"]["columns"] == "json"
    assert set(info["dropped"]) == {"images", "opaque"}  # raw media, and what is neither plain nor JSON
    assert "images" not in back and "opaque" not in back
    assert info["tensors"]["position_ids"] == {"dtype": "int64", "shape": [3, PROMPT + RESPONSE]}


def test_multi_modal_inputs_are_written_once_and_referenced(tmp_path):
    batch = _batch()
    write_step(str(tmp_path), 1, batch)
    from safetensors.torch import load_file

    stored = load_file(multi_modal_file(str(tmp_path), 1))
    assert sorted(stored) == ["0/image_grid_thw", "0/pixel_values"]  # the group's second sample references them
    back = read_step(str(tmp_path), 1)["multi_modal_inputs"]
    assert _same(back[1]["pixel_values"], batch["multi_modal_inputs"][1]["pixel_values"])
    assert back[0]["pixel_values"] is back[1]["pixel_values"]  # shared again, as the prompt's copies were
    assert back[2] == {} and back[3] == {}
    # a sample of the group whose tensor differs (a multi-turn tool image) gets its own
    batch.extras["multi_modal_inputs"][1] = {"pixel_values": torch.ones(6, 4),
                                             "image_grid_thw": torch.tensor([[1, 2, 3]])}
    write_step(str(tmp_path), 2, batch)
    assert sorted(load_file(multi_modal_file(str(tmp_path), 2))) == [
        "0/image_grid_thw", "0/pixel_values", "1/pixel_values"]
    assert torch.equal(read_step(str(tmp_path), 2)["multi_modal_inputs"][1]["pixel_values"], torch.ones(6, 4))


def test_a_text_batch_writes_no_multi_modal_file_and_derives_the_colocated_weight_version(tmp_path):
    import pyarrow.parquet as pq

    batch = _batch()
    del batch.extras["multi_modal_inputs"], batch.extras["weight_version"]
    write_step(str(tmp_path), 5, batch)
    assert not os.path.exists(multi_modal_file(str(tmp_path), 5))
    table = pq.read_table(step_file(str(tmp_path), 5))
    assert table.column("weight_version").to_pylist() == [4] * BSZ  # the weights a colocated step 5 generates with
    assert table.column("step").to_pylist() == [5] * BSZ and table.column("index").to_pylist() == [0, 1, 2, 3]
    assert "weight_version" not in read_step(str(tmp_path), 5)  # derived: not part of the batch read back


def test_pandas_and_datasets_read_a_step(tmp_path):
    import pandas as pd

    batch = _batch()
    path = write_step(str(tmp_path), 3, batch)
    frame = pd.read_parquet(path)
    assert frame["uid"].tolist() == batch["uid"] and frame["step"].tolist() == [3] * BSZ
    assert frame["responses"].map(list).tolist() == batch["responses"].tolist()
    assert json.loads(frame["columns"][0]) == {"prompt": "What is 2+2?", "level": 1}
    import datasets

    rows = datasets.load_dataset("parquet", data_files=path, split="train", cache_dir=str(tmp_path / "cache"))
    assert rows["uid"] == batch["uid"]
    assert rows["rollout_log_probs"][1] == batch["rollout_log_probs"][1].tolist()
    assert rows["position_ids"][0] == batch["position_ids"][0].reshape(-1).tolist()  # rows are flattened (C order)


def test_replay_inputs_drop_what_the_step_computes_again():
    kept = replay_inputs(_batch())
    assert "old_log_probs" not in kept and "advantages" not in kept
    assert not set(RECOMPUTED) & set(kept.tensors.keys())
    assert "rollout_log_probs" in kept and "token_level_scores" in kept and "reward_baselines" in kept


def test_prune_keeps_the_newest_steps(tmp_path):
    for step in (1, 2, 3, 4):
        write_step(str(tmp_path), step, _batch(step))
    assert dumped_steps(str(tmp_path)) == [1, 2, 3, 4]
    assert prune(str(tmp_path), -1) == [] and dumped_steps(str(tmp_path)) == [1, 2, 3, 4]
    assert prune(str(tmp_path), 2) == [1, 2]
    assert dumped_steps(str(tmp_path)) == [3, 4]
    assert not os.path.exists(multi_modal_file(str(tmp_path), 1)) and os.path.exists(multi_modal_file(str(tmp_path), 3))


def test_the_writer_records_the_prompt_position_and_times_itself(tmp_path):
    dump = RolloutDump(str(tmp_path), 1, position=lambda: {"epoch": 1})
    metrics = {"actor/pg_loss": 0.5}
    for step in (1, 2):
        dump.write(step, _batch(step), metrics)
    assert dumped_steps(str(tmp_path)) == [2]  # rollout_data_limit=1
    info = step_info(str(tmp_path), 2)
    assert info["prompt_position"] == {"epoch": 1} and info["metrics"]["actor/pg_loss"] == 0.5
    assert metrics["timing_s/rollout_dump"] >= 0


def test_numpy_and_tensor_numbers_are_written_as_numbers(tmp_path):
    import numpy as np

    batch = _batch()
    batch["rollout_seed"] = [np.int64(i) for i in range(BSZ)]  # not plain: JSON numbers
    write_step(str(tmp_path), 1, batch, {"actor/lr": np.float32(0.5), "actor/n": torch.tensor(2.0), "bad": object()})
    assert read_step(str(tmp_path), 1)["rollout_seed"] == [0, 1, 2, 3]
    assert step_info(str(tmp_path), 1)["metrics"] == {"actor/lr": 0.5, "actor/n": 2.0}  # a value JSON lacks: left out


def test_describe_steps():
    assert describe_steps([]) == "none"
    assert describe_steps([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"


def test_a_missing_folder_or_step_is_named(tmp_path):
    from easyrl.errors import RunStateError

    with pytest.raises(RunStateError, match="does not exist"):
        read_step(str(tmp_path / "nowhere"), 1)
    write_step(str(tmp_path), 1, _batch())
    write_step(str(tmp_path), 2, _batch())
    with pytest.raises(RunStateError, match=r"has no step 7 \(step_000007.parquet\); it holds steps 1-2"):
        read_step(str(tmp_path), 7)


# -- easyrl rollouts -----------------------------------------------------------------------------------------------


def test_easyrl_rollouts_prints_a_steps_samples(tmp_path, capsys, tiny_model_path):
    from easyrl.cli import main

    batch = _batch()
    batch["advantages"] = torch.full((BSZ, RESPONSE), 0.5)
    colocated = _batch(1)
    del colocated.extras["weight_version"]
    write_step(str(tmp_path), 1, colocated, {"reward/overall": 0.5})
    write_step(str(tmp_path), 2, batch, {"reward/overall": 0.25, "actor/pg_loss": -0.125})
    assert main(["rollouts", str(tmp_path), "--no-text"]) == 0  # the last step
    head, columns, *rows = capsys.readouterr().out.splitlines()
    assert head == f"{tmp_path}: steps 1-2; step 2: 4 samples, reward/overall 0.25, actor/pg_loss -0.125"
    assert columns.split() == ["index", "uid", "prompt", "response", "reward", "advantage", "version"]
    assert [row.split() for row in rows] == [
        ["0", "g0", "2", "3", "1", "0.5", "3"], ["1", "g0", "3", "5", "0", "0.5", "3"],
        ["2", "g1", "1", "1", "0", "0.5", "2"], ["3", "g1", "3", "2", "0", "0.5", "2"]]
    
    assert main(["rollouts", str(tmp_path), "--step", "1", "--rows", "1", "--width", "12",
                 "--tokenizer", str(tiny_model_path("qwen2_5"))]) == 0
    head, columns, *rows = capsys.readouterr().out.splitlines()
    assert columns.split()[-1] == "text" and len(rows) == 1
    assert rows[0].split()[6] == "0"  # a colocated step 1: the weights after 0 steps, the file's derived column
    assert len(rows[0]) - len(columns.rsplit("text", 1)[0]) <= 12  # the decoded response, cut to --width
