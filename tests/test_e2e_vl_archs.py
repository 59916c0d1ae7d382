"""The other Qwen-VL generations through the real loop: one GRPO step each with 2 workers, checking that vLLM's
sampled-token log-probs equal the FSDP2 actor's (positions, image features and weight sync agree for the
architecture), on the Geometry3K sample."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen3_vl"])
def test_one_step_vllm_matches_actor(arch, e2e_config, trainer_on_ray, tmp_path):
    config = e2e_config(
        arch, tmp_path,
        "data.val_files=null",
        "data.max_response_length=16",
        "worker.rollout.calculate_log_probs=true",
    )
    with trainer_on_ray(config) as trainer:
        metrics = trainer.train_step(trainer.prompt_stream())
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["prompt_length/min"] > 40  # image tokens are part of the prompt
    assert metrics["rollout/log_prob_diff_max"] < 2e-3, metrics["rollout/log_prob_diff_max"]
    assert metrics["rollout/log_prob_diff_median"] < 1e-4  # the sync check's statistic (fp32), far under its bound
