"""bench/async_speed.py's pure parts: the modes' settings, a run's summary from metrics rows, the ratios and the
analytic model (no model is run here; bench/README.md holds the measured numbers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))


def test_the_modes_use_equal_total_cores_on_the_same_workload():
    from async_speed import overrides

    from easyrl.config import load_config

    colocated = load_config(overrides("colocated", "/tmp/x/a", "unused", 5, []))
    split = load_config(overrides("one_step_off", "/tmp/x/a", "unused", 5, []))
    assert (colocated.trainer.n_gpus_per_node * colocated.trainer.cpu_threads_per_worker,
            colocated.worker.rollout.n_gpus_per_node) == (2, None)
    assert ((split.trainer.n_gpus_per_node + split.worker.rollout.n_gpus_per_node)
            * split.trainer.cpu_threads_per_worker) == 2
    for cfg in (colocated, split):
        assert (cfg.data.max_response_length, cfg.algorithm.use_kl_loss, cfg.trainer.max_steps) == (128, False, 5)
        assert cfg.on_policy_update and not cfg.trainer.val_before_train
    assert split.trainer.run_dir == "/tmp/x/a/one_step_off"
    with pytest.raises(ValueError, match="one of colocated"):
        overrides("sync", "/tmp/x/a", "unused", 5, [])


def _row(step: float, gen: float, tokens: float, mean: float, maximum: float, **more) -> dict:
    return {"timing_s/step": step, "timing_s/gen": gen, "perf/total_num_tokens": tokens,
            "perf/rollout_tokens_per_s": tokens / gen, "response_length/mean": mean, "response_length/max": maximum,
            "reward/overall": 0.5, **more}


def test_summarize_a_colocated_and_a_split_run():
    from async_speed import ratios, summarize, table

    colocated = summarize([{"step": 0}, _row(30, 20, 900, 20, 100), _row(20, 12, 1000, 25, 100),
                           _row(20, 8, 1000, 50, 100)])
    assert (colocated["steps"], colocated["median_step_s"], colocated["tokens_per_s"]) == (3, 20, 50)
    assert colocated["run_tokens_per_s"] == 2900 / 70
    assert (colocated["gen_s"], colocated["train_s"], colocated["overlap_bound"]) == (10, 10, 0.5)
    assert colocated["train_idle"] == 40 / 70 and colocated["rollout_idle"] == 30 / 70
    assert colocated["tail_idle"] == 0.75  # median of 0.8, 0.75, 0.5
    transfer = {"timing_s/weight_transfer": 1.0, "async/rollout_idle_s": 2.0, "async/staleness_max": 1.0}
    split = summarize([_row(40, 20, 900, 20, 100, **{"async/train_idle_s": 20.0}, **transfer),
                       _row(16, 14, 1000, 20, 100, **{"async/train_idle_s": 3.0}, **transfer),
                       _row(14, 14, 1000, 20, 100, **{"async/train_idle_s": 1.0}, **transfer)])
    assert split["train_s"] == 12 and split["train_idle"] == 24 / 70 and split["rollout_idle"] == 6 / 70
    assert split["staleness_max"] == 1 and split["transfer_s"] == 1.0
    summary = {"colocated": colocated, "one_step_off": split}
    rel = ratios(summary)
    assert rel["colocated"] == {"tokens_per_s": 1.0, "run_tokens_per_s": 1.0, "step": 1.0}
    assert rel["one_step_off"]["step"] == 20 / 15
    assert "| one_step_off | 15.0 |" in table(summary)


def test_the_model_overlaps_nothing_without_a_tail_and_fills_the_tail_in_async():
    from async_speed import model_speedups

    # without a tail, time scales with the devices: a split at the best integer point is no faster
    assert model_speedups(0.5, 0.0, 8) == {"one_step_off": 1.0, "one_step_off_rollout_devices": 4,
                                           "async": 1.0, "async_rollout_devices": 4}
    # verl's one-step-off table (16 GPUs, generation 43% of the step, 72% of it not shrinking with devices)
    verl = model_speedups(0.43, 0.72, 16)
    assert 1.2 < verl["one_step_off"] < 1.35 and verl["one_step_off_rollout_devices"] == 4
    assert verl["async"] > verl["one_step_off"]
    with pytest.raises(ValueError, match="devices=1"):
        model_speedups(0.5, 0.5, 1)
