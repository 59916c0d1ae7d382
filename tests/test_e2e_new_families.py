"""One GRPO step through Ray on families that are not in the registry (issue #49), admitted by their self-check:
gpt-oss (mixture of experts with attention sinks and sliding-window layers; its experts and sinks reloaded past vLLM's
layer-wise reload, ``vllm_compat.RELOAD_BY_COPY``), OLMo 3 (dense, sliding-window layers; vLLM serves it through
its Transformers backend) and DeepSeek-V3 (multi-head latent attention, whose sampled tokens take vLLM's absorbed
decode path, and per-expert released names). Each is the tiny twin of its default config (seeded with its released
values, ``easyrl.models.twin``) with SmolLM2's
tokenizer (the data path needs a real chat template), fp32 on both sides, 2 workers: vLLM's sampled-token log-probs
must equal the FSDP2 actor's after the weight sync (``rollout/log_prob_diff_max``, the registry's 2e-3).

Under ``make test-slow`` (two trainer start-ups and a self-check each; measured in docs/models.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _twin_with_smollm2_tokenizer(model_type: str, out: Path) -> Path:
    """The twin of ``model_type``'s default config (and released values) with SmolLM2's vocabulary and special ids,
    random fp32 weights, SmolLM2's tokenizer files."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoTokenizer

    from easyrl.models.twin import seed_released, twin_config
    from easyrl.testing.smollm2 import smollm2_path
    from easyrl.testing.tiny_families import SMOLLM2_IDS

    config = twin_config(seed_released(CONFIG_MAPPING[model_type]()))
    config.update(SMOLLM2_IDS)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_path()).save_pretrained(out)
    return out


@pytest.mark.parametrize("model_type", ["gpt_oss", "olmo3", "deepseek_v3"])
def test_one_grpo_step_of_a_family_outside_the_registry(model_type, local_ray, e2e_text_config, tmp_path,
                                                        monkeypatch):
    from easyrl.models.families import FAMILIES
    from easyrl.trainer.__main__ import build_trainer

    assert model_type not in FAMILIES
    monkeypatch.setenv("EASYRL_CACHE", str(tmp_path / "cache"))  # the self-check runs (and is cached) here
    folder = _twin_with_smollm2_tokenizer(model_type, tmp_path / model_type)
    config = e2e_text_config(tmp_path, f"worker.actor.model.model_path={folder}")
    local_ray()
    trainer = build_trainer(config)
    try:
        metrics = trainer.train_step(trainer.prompt_stream())
    finally:
        trainer.close()
    gap = metrics["rollout/log_prob_diff_max"]
    print(f"NEW_FAMILY {model_type} parity max={gap:.3g} probs_diff_mean={metrics['rollout/probs_diff_mean']:.3g}")
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert gap < 2e-3, metrics
    assert list((tmp_path / "cache" / "selfcheck").glob(f"{model_type}-*.json"))  # admitted by its self-check
