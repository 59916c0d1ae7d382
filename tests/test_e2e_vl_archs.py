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
def test_one_step_vllm_matches_actor(arch, tiny_model_path, tmp_path):
    import ray

    from easyrl.config import load_config
    from easyrl.trainer.__main__ import build_trainer

    config = load_config([
        f"config={REPO / 'examples/configs/cpu_demo.yaml'}",
        f"worker.actor.model.model_path={tiny_model_path(arch)}",
        f"data.train_files={REPO / 'examples/data/geometry3k_sample'}",
        "data.val_files=null",
        f"data.format_prompt={REPO / 'examples/format_prompt/math.jinja'}",
        "data.max_response_length=16",
        f"worker.reward.reward_function={REPO / 'tests/reward_functions/letters.py'}:compute_score",
        "worker.reward.reward_function_kwargs={}",
        "worker.rollout.calculate_log_probs=true",
        f"trainer.runs_root={tmp_path}",
    ])
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        trainer = build_trainer(config)
        metrics = trainer.train_step(trainer.prompt_stream())
        trainer.workers.shutdown()
    finally:
        ray.shutdown()
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["prompt_length/min"] > 40  # image tokens are part of the prompt
    assert metrics["rollout/log_prob_diff_max"] < 2e-3, metrics["rollout/log_prob_diff_max"]
