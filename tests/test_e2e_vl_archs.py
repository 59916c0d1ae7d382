"""The other Qwen-VL generations through the real loop: one GRPO step each with 2 workers, checking that vLLM's
sampled-token log-probs equal the FSDP2 actor's (positions, image features and weight sync agree for the
architecture), on the Geometry3K sample."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


# Both under `make test-slow` (the suite's time, docs/development.md): Qwen2.5-VL, Qwen2-VL's vision tower with
# windowed attention, is the demo's and test_e2e_grpo's model; Qwen3-VL-MoE (tests/test_e2e_qwen3_archs.py) has
# Qwen3-VL's vision tower, DeepStack features and interleaved 3-D positions
@pytest.mark.slow
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
