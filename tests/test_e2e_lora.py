"""LoRA end to end (``worker.actor.model.lora``): GRPO with 2 Ray workers on the tiny Qwen2.5 (real classes, random
weights), peft's adapter on every linear layer, the reference policy = the actor with its adapter switched off.

Checks: an update changes only the adapter matrices; the next rollout samples with the merged weights (vLLM's
log-probs equal the actor's and differ from the base model's); the exported merged model loads in transformers and
equals base + alpha / rank * B @ A, and the exported adapter loads in peft and merges to the same weights."""

from __future__ import annotations

import math

import pytest
import torch

from easyrl.testing.worker import InspectableWorker

pytestmark = pytest.mark.e2e

# fp32 vLLM CPU kernels vs the FSDP2 forward (see tests/test_e2e_grpo.py)
LOGPROB_TOL = 2e-3


def test_lora_grpo_updates_only_the_adapter_and_vllm_samples_the_merged_model(e2e_text_config, trainer_on_ray,
                                                                             tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from easyrl.models.lora import is_adapter_key

    config = e2e_text_config(
        tmp_path,
        "worker.actor.model.lora.rank=4",
        "worker.actor.model.lora.alpha=8",
        "worker.actor.optim.lr=1e-2",  # an adapter starting at B = 0 must visibly move in one step
    )
    with trainer_on_ray(config, InspectableWorker) as trainer:
        stream = trainer.prompt_stream()
        weights_0 = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
        trainer.global_step = 1
        metrics_1 = trainer.train_step(stream)
        weights_1 = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
        trainer.global_step = 2
        metrics_2 = trainer.train_step(stream)
        batch = trainer.last_batch
        weights_2 = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
        export = trainer.save_model()

    assert metrics_1["critic/advantages/max"] > 0  # the test reward varies within groups
    changed = {name for name in weights_0 if not torch.equal(weights_0[name], weights_1[name])}
    assert changed and all(is_adapter_key(name) for name in changed), sorted(changed)[:5]
    assert any("lora_B" in name for name in changed)  # B left 0: the merged model is no longer the base

    # step 2 sampled with the merged step-1 weights: vLLM agrees with the actor, and not with the base (reference)
    assert metrics_2["rollout/log_prob_diff_max"] < LOGPROB_TOL, metrics_2["rollout/log_prob_diff_max"]
    mask = batch["response_mask"]
    stale_gap = ((batch["rollout_log_probs"] - batch["ref_log_probs"]).abs() * mask).max().item()
    assert stale_gap > 10 * LOGPROB_TOL, stale_gap
    assert metrics_2["actor/kl_loss"] > 0  # the adapter moved the actor away from the base
    assert all(math.isfinite(v) for v in metrics_2.values()), metrics_2

    print(f"LORA_E2E parity={metrics_2['rollout/log_prob_diff_max']:.3g} stale_gap={stale_gap:.3g}")

    # the merged export (in the base's dtype, bf16 for the tiny model): plain names, W + alpha / rank * B @ A of the
    # final weights, rounded once to bf16
    bf16 = dict(rtol=2**-8, atol=1e-6)
    merged = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).state_dict()
    prefix = "model.layers.0.self_attn.q_proj"
    w, a, b = (weights_2[f"{prefix}.{part}"] for part in
               ("base_layer.weight", "lora_A.default.weight", "lora_B.default.weight"))
    assert torch.allclose(merged[f"{prefix}.weight"], w + (8 / 4) * b @ a, **bf16)
    assert not torch.allclose(merged[f"{prefix}.weight"], w, **bf16)
    assert torch.allclose(merged["model.norm.weight"], weights_2["model.norm.weight"], **bf16)
    # the adapter alone, in peft's format, on the base model: the same merged weights
    base = AutoModelForCausalLM.from_pretrained(config.worker.actor.model.model_path, dtype=torch.float32)
    peft_merged = PeftModel.from_pretrained(base, f"{export}/lora_adapter").merge_and_unload().state_dict()
    assert peft_merged.keys() == merged.keys()
    for name, value in merged.items():
        assert torch.allclose(peft_merged[name], value, **bf16), name
