"""Rollout tensor parallelism's placement and dispatch (easyrl.workers.rollout_layout): which ranks share an engine,
which share of the batch each samples, and how the responses come back in prompt order."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config.checks import check_tensor_parallel
from easyrl.workers.rollout_layout import (
    RolloutLayout,
    check_heads_split,
    split_head_counts,
)


def test_groups_are_consecutive_ranks_and_every_rank_is_in_one():
    layout = RolloutLayout(world_size=8, tensor_parallel_size=4)
    assert layout.dp_size == 2
    assert layout.groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [layout.tp_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    # 16 devices on 2 nodes of 8 (node-contiguous ranks), TP 8: one engine per node, none across the network
    assert [set(g) for g in RolloutLayout(16, 8).groups()] == [set(range(8)), set(range(8, 16))]


def test_the_engine_seed_rank_is_shared_within_a_group_and_differs_between_groups():
    layout = RolloutLayout(world_size=4, tensor_parallel_size=2)
    assert layout.dp_rank(0) == layout.dp_rank(1) != layout.dp_rank(2) == layout.dp_rank(3)


def _simulate(world: int, tp: int, prompts: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """Dispatch a batch as ``WorkerGroup.run_rollout`` does (``Batch.chunk`` per engine), with a stand-in for the
    engines: every rank 'samples' its share (response = prompt * 10 + the tp_rank of the rank that ran it, so a
    response kept from the wrong rank would show). Returns (per-rank prompts, collected responses per engine)."""
    layout = RolloutLayout(world, tp)
    batch = Batch(TensorDict({"prompt": torch.tensor(prompts)}, batch_size=[len(prompts)]), {})
    per_rank = [share["prompt"].tolist() for share in layout.dispatch(batch.chunk(layout.dp_size))]
    outputs = [[p * 10 + layout.tp_rank(rank) for p in share] for rank, share in enumerate(per_rank)]
    return per_rank, layout.collect(outputs)


@pytest.mark.parametrize("world, tp", [(2, 1), (2, 2), (4, 2), (8, 4), (8, 8)])
def test_every_rank_of_an_engine_gets_its_share_and_responses_line_up_with_prompts(world, tp):
    prompts = list(range(16))
    per_rank, responses = _simulate(world, tp, prompts)
    layout = RolloutLayout(world, tp)
    for group in layout.groups():
        assert all(per_rank[r] == per_rank[group[0]] for r in group)  # the whole TP group samples the same prompts
    assert sorted(p for group in layout.groups() for p in per_rank[group[0]]) == prompts  # each prompt once
    assert [r for out in responses for r in out] == [p * 10 for p in prompts]  # in order, from tp_rank 0


def test_tp_1_is_the_plain_split():
    layout = RolloutLayout(world_size=4)
    shares = ["a", "b", "c", "d"]
    assert layout.dispatch(shares) == shares
    assert layout.collect(["w", "x", "y", "z"]) == ["w", "x", "y", "z"]


@pytest.mark.parametrize("world, tp", [(2, 3), (8, 3), (4, 0), (6, 4)])
def test_a_size_that_does_not_divide_the_devices_is_refused_with_the_sizes_that_fit(world, tp):
    with pytest.raises(ValueError, match="tensor_parallel_size") as err:
        RolloutLayout(world, tp)
    fits = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
    assert f"choose one of {fits}" in str(err.value)
    check_tensor_parallel(world, 1)  # always fits


def test_wrong_share_or_result_counts_are_refused():
    layout = RolloutLayout(4, 2)
    with pytest.raises(ValueError, match="2 rollout replicas"):
        layout.dispatch(["only one"])
    with pytest.raises(ValueError, match="4 ranks"):
        layout.collect(["a", "b"])


def test_heads_must_split_over_an_engine_and_kv_heads_may_be_replicated():
    from transformers import Qwen2_5_VLConfig, Qwen2Config

    text = Qwen2Config(num_attention_heads=8, num_key_value_heads=2, hidden_size=512)
    for tp in (1, 2, 4, 8):  # KV heads: 4 and 8 ranks hold copies of the 2 KV heads
        check_heads_split(text, tp)
    with pytest.raises(ValueError, match="num_attention_heads=8 .* must divide it"):
        check_heads_split(text, 3)
    with pytest.raises(ValueError, match="num_key_value_heads=4 .* divide it or be a multiple"):
        check_heads_split(Qwen2Config(num_attention_heads=12, num_key_value_heads=4, hidden_size=768), 6)
    # Qwen2.5-VL: the vision tower's heads are split too
    vl = Qwen2_5_VLConfig(text_config=dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=512),
                          vision_config=dict(num_heads=6))
    assert split_head_counts(vl) == {"text_config.num_attention_heads": 8, "text_config.num_key_value_heads": 2,
                                     "vision_config.num_heads": 6}
    with pytest.raises(ValueError, match="vision_config.num_heads=6"):
        check_heads_split(vl, 4)


def test_only_this_ranks_leftover_tp_shm_segment_is_removed(tmp_path):
    """vLLM-CPU's TP all-reduce segments (names as found in /dev/shm after a run) are removed for this rank only."""
    from easyrl.workers.vllm_cpu_fixes import remove_stale_tp_shm, stale_tp_shm_segments

    names = ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "-tp:0-[2-3]-cpushm_0", "psm_8616c9a9",
             "-tp:0-[0-1-2-3]-cpushm_0"]
    assert stale_tp_shm_segments(names, [0, 1], 0) == ["-tp:0-[0-1]-cpushm_0"]
    assert stale_tp_shm_segments(names, [2, 3], 0) == ["-tp:0-[2-3]-cpushm_0"]
    assert stale_tp_shm_segments(names, [0, 1, 2, 3], 1) == []
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert remove_stale_tp_shm("cuda", RolloutLayout(4, 2), 1, shm_dir=str(tmp_path)) == []  # the CPU backend's only
    assert remove_stale_tp_shm("cpu", RolloutLayout(4, 1), 1, shm_dir=str(tmp_path)) == []  # no TP: no segments
    assert remove_stale_tp_shm("cpu", RolloutLayout(4, 2), 1, shm_dir=str(tmp_path)) == ["-tp:0-[0-1]-cpushm_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(names) - {"-tp:0-[0-1]-cpushm_1"})


def test_split_rollout_engines_lay_out_no_sequence_parallel_groups():
    """``worker.actor.ulysses_size=2``, 2 trainer devices, 1 rollout device (device review 2026-12-02, S2-N3): the
    trainer's group shares its batch per sequence-parallel pair; the rollout engines' group, which runs no training
    pass, one share per rank (its layout over ulysses_size raised ConfigError after the trainer had loaded)."""
    from easyrl.errors import ConfigError
    from easyrl.workers.fsdp_worker import Parts
    from easyrl.workers.group import data_layout

    trainer = data_layout(world_size=2, ulysses_size=2, models=Parts(engine=False).models)
    assert (trainer.dp_size, trainer.groups()) == (1, [[0, 1]])
    rollout = data_layout(world_size=1, ulysses_size=2, models=Parts(models=False).models)
    assert (rollout.dp_size, rollout.groups()) == (1, [[0]])
    with pytest.raises(ConfigError):  # the layout a training group of one device would need
        data_layout(world_size=1, ulysses_size=2, models=True)
