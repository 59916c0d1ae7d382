"""bench/trl_grpo.py maps an easyrl config onto TRL's GRPOConfig setting by setting (no model is run here; the bench
smoke test in test_e2e_bench.py trains with it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))


def config(*overrides: str):
    from easyrl.config import load_config

    return load_config([f"config={REPO / 'examples/configs/smollm2_learn.yaml'}",
                        "worker.actor.model.model_path=unused", *overrides])


def test_grpo_config_matches_the_easyrl_settings(tmp_path):
    from trl_grpo import grpo_config

    cfg = config("algorithm.kl_coef=0.04", "worker.actor.optim.lr=3e-5", "data.seed=7")
    trl = grpo_config(cfg, str(tmp_path))
    assert (trl.per_device_train_batch_size, trl.num_generations, trl.gradient_accumulation_steps) == (32, 4, 1)
    assert trl.generation_batch_size == 32  # one rollout batch = one optimizer step, as easyrl's global batch
    assert (trl.max_completion_length, trl.temperature, trl.top_p) == (48, 1.0, 1.0)
    assert (trl.beta, trl.epsilon, trl.epsilon_high, trl.loss_type) == (0.04, 0.2, 0.28, "dapo")
    assert not trl.use_bias_correction_kl  # easyrl's low_var_kl: k3, not ratio * k3 (tests/test_trl_parity.py)
    assert (trl.learning_rate, trl.weight_decay, trl.adam_beta1, trl.adam_beta2) == (3e-5, 0.0, 0.9, 0.999)
    assert (trl.max_grad_norm, trl.lr_scheduler_type, trl.num_iterations) == (1.0, "constant", 1)
    assert (trl.scale_rewards, trl.max_steps, trl.seed) == ("group", 16, 7)
    assert grpo_config(config("algorithm.use_kl_loss=false"), str(tmp_path)).beta == 0.0
    assert not trl.bf16  # the learning config trains in fp32
    assert grpo_config(config("worker.actor.fsdp.param_dtype=bf16"), str(tmp_path)).bf16  # autocast, as easyrl


@pytest.mark.parametrize("override, key", [
    ("algorithm.adv_estimator=rloo", "algorithm.adv_estimator"),
    ("worker.actor.loss_agg_mode=seq-mean-token-mean", "worker.actor.loss_agg_mode"),
    ("algorithm.kl_penalty=kl", "algorithm.kl_penalty"),
    ("worker.actor.global_batch_size=4", "worker.actor.global_batch_size"),
])
def test_grpo_config_refuses_what_trl_cannot_reproduce(tmp_path, override, key):
    from trl_grpo import grpo_config

    with pytest.raises(ValueError, match=f"{key}=.*reproduces only"):
        grpo_config(config(override), str(tmp_path))


def test_prompts_are_the_ones_easyrl_tokenizes():
    from transformers import AutoTokenizer
    from trl_grpo import load_prompts

    from easyrl.data.dataset import RLDataset
    from easyrl.testing.smollm2 import smollm2_path

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    cfg = config()
    rows = load_prompts(cfg, str(REPO / "examples/data/digit_addition/val.jsonl"), tokenizer)
    dataset = RLDataset(str(REPO / "examples/data/digit_addition/val.jsonl"), tokenizer, None, format_prompt=None,
                        max_prompt_length=64)
    assert len(rows) == len(dataset) == 20
    for i in (0, 19):
        assert tokenizer.encode(rows[i]["prompt"], add_special_tokens=False) == dataset[i]["prompt_ids"]
        assert rows[i]["ground_truth"] == dataset[i]["ground_truth"]
    assert rows[0]["prompt"].endswith("What is 7 + 2? Reply with only the number.<|im_end|>\n<|im_start|>assistant\n")
