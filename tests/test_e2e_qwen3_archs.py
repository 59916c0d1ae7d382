"""The newer Qwen architectures through the real loop: one GRPO step each with 2 workers on the Geometry3K sample,
tiny random-weight models of Qwen3-VL-MoE (routed experts), Qwen3.5 (hybrid Gated DeltaNet + gated attention) and
Qwen3.5-MoE (both), checking that vLLM's sampled-token log-probs equal the FSDP2 actor's after the weight sync
(float32 on both sides; tolerance 2e-3 as for the other architectures) and that the update moved the experts."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.e2e

LOGPROB_TOL = 2e-3


@pytest.mark.parametrize("arch", ["qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"])
def test_one_step_vllm_matches_actor(arch, e2e_config, tmp_path):
    import ray

    from easyrl.trainer.__main__ import build_trainer

    config = e2e_config(
        arch, tmp_path,
        "data.val_files=null",
        "data.max_response_length=16",
        "worker.rollout.calculate_log_probs=true",
    )
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        trainer = build_trainer(config)
        metrics = trainer.train_step(trainer.prompt_stream())
        trainer.workers.shutdown()
    finally:
        ray.shutdown()
    print(f"ARCH_E2E {arch} parity={metrics['rollout/log_prob_diff_max']:.3g}")
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["prompt_length/min"] > 40  # image tokens are part of the prompt
    assert metrics["rollout/log_prob_diff_max"] < LOGPROB_TOL, metrics["rollout/log_prob_diff_max"]
