"""End to end with a text-only model: the tiny Qwen2.5 (Qwen2ForCausalLM, real Qwen2.5 vocabulary) through the same
path as the VL job (`build_trainer` + `fit`), on the Geometry3K sample with its images dropped by the dataset."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from easyrl.testing.worker import InspectableWorker

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


def test_text_model_trains_validates_and_exports(e2e_config, trainer_on_ray, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = e2e_config(
        "qwen2_5", tmp_path,
        "worker.rollout.limit_images=0",
        "worker.rollout.calculate_log_probs=true",
        "trainer.max_steps=1",
        "trainer.val_freq=1",
    )
    with trainer_on_ray(config) as trainer:
        trainer.fit()
    run_dir = Path(config.trainer.run_dir)
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1
    assert all(math.isfinite(v) for k, v in row.items() if isinstance(v, float)), row
    assert row["prompt_length/max"] < 200  # no image tokens in a text-only prompt
    # left-padded text prompts: the actor's positions must match vLLM's (which sees no padding)
    assert row["rollout/log_prob_diff_max"] < 2e-3
    assert row["rollout/log_prob_diff_median"] < 1e-4  # fp32: the sync check's statistic, 1000x under its bound
    assert "val/reward/overall" in row and row["critic/advantages/max"] > 0
    # the start-up profile, in the first row only (easyrl.trainer.launch.StartupProfile)
    assert row["timing_s/startup/total"] > row["timing_s/startup/engine"] > 0 and "timing_s/startup/first_sync" in row
    exported = run_dir / "huggingface"
    AutoModelForCausalLM.from_pretrained(exported)
    assert AutoTokenizer.from_pretrained(exported).eos_token == "<|im_end|>"


def test_a_broken_weight_sync_stops_the_first_step_before_the_update(e2e_text_config, trainer_on_ray, tmp_path):
    """One tensor skipped by the sync keeps vLLM's start-up dummy values (~0): the sync check (on by default) stops
    step 1 after the old-log-prob pass, before the update, with the metric, the bound and the key in the message."""
    from easyrl.errors import user_error_of
    from easyrl.workers.weight_sync import WeightSyncError

    config = e2e_text_config(tmp_path, "trainer.max_steps=1", "trainer.n_gpus_per_node=1")  # one engine: cheaper
    with trainer_on_ray(config, worker_cls=InspectableWorker) as trainer:
        trainer.workers.run_all(InspectableWorker.break_sync, "model.layers.0.input_layernorm.weight")
        before = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
        with pytest.raises(Exception) as failure:
            trainer.fit()
        after = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
    error = user_error_of(failure.value)
    assert isinstance(error, WeightSyncError), failure.value
    assert "rollout/log_prob_diff_median" in str(error) and "worker.actor.rollout_sync_threshold = 0.1" in str(error)
    assert all(torch.equal(before[key], after[key]) for key in before)  # no update ran
