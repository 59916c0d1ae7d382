"""End to end with a discriminative reward model (issue #23): one GRPO step of the tiny Qwen2.5 policy on Ray with
vLLM, the tiny reward model (``Qwen2ForSequenceClassification``, its own chat template) FSDP2-sharded over the two
workers, mixed into the rule reward with weight 0.5. One trainer for the module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e

WEIGHT = 0.5
SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "data" / "geometry3k_sample"


@pytest.fixture(scope="module")
def stepped(e2e_text_config, trainer_on_ray, tmp_path_factory):
    """``(trainer, metrics)`` after one training step with the reward model (micro-batches of 3 by a token budget)."""
    from easyrl.testing.tiny_reward_model import build_tiny_reward_model

    config = e2e_text_config(
        tmp_path_factory.mktemp("rm"),
        f"worker.reward.reward_model.model_path={build_tiny_reward_model()}",
        f"worker.reward.reward_model.weight={WEIGHT}",
        "worker.reward.reward_model.micro_batch_size_per_device=3",
        "trainer.max_steps=1",
        f"data.val_files={SAMPLE}",
        "data.val_batch_size=3",  # a last batch of 1 or 2: padded to the 2 workers' equal shares
    )
    with trainer_on_ray(config) as trainer:
        metrics = trainer.train_step(trainer.prompt_stream())
        yield trainer, metrics


def test_worker_scores_equal_a_direct_transformers_call(stepped):
    from transformers import AutoModelForSequenceClassification

    from easyrl.rewards.reward_model_inputs import encode_conversations

    trainer, _ = stepped
    batch, rm = trainer.last_batch, trainer.model_rewards.reward_model
    scores = torch.tensor(batch["score/reward_model"])
    prompts, responses = rm.conversations(batch)  # the batch back in generation order: the scores must follow it
    texts = encode_conversations(rm.tokenizer, prompts, responses).texts
    assert texts[0].startswith("<|im_start|>user\n") and "system" not in texts[0]  # the RM's own template
    direct = AutoModelForSequenceClassification.from_pretrained(rm.config.model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = torch.stack([direct(**rm.tokenizer(t, add_special_tokens=False, return_tensors="pt")).logits[0, 0]
                                for t in texts])
    assert len(scores) == 16 and scores.std() > 1e-3
    assert torch.allclose(scores, expected, atol=1e-5, rtol=0), (scores - expected).abs().max()


def test_the_weighted_score_enters_the_reward_and_the_metrics(stepped):
    trainer, metrics = stepped
    batch = trainer.last_batch
    rm = torch.tensor(batch["score/reward_model"])
    rule = torch.tensor(trainer.scorer.reward_fn(trainer.scorer.reward_inputs(batch))["overall"])
    overall = torch.tensor(batch["score/overall"])
    assert torch.allclose(overall, rule + WEIGHT * rm, atol=1e-6)
    assert torch.allclose(batch["token_level_scores"].sum(-1), overall, atol=1e-6)
    assert metrics["reward/reward_model"] == pytest.approx(rm.mean().item(), abs=1e-6)
    assert metrics["reward/overall"] == pytest.approx(overall.mean().item(), abs=1e-6)
    assert metrics["timing_s/reward_model"] > 0 and metrics["reward_model/truncated"] == 0.0
    print({key: round(metrics[key], 3) for key in ("timing_s/reward_model", "timing_s/ref", "timing_s/update_actor",
                                                    "timing_s/step") if key in metrics})  # shown with pytest -s


def test_validation_scores_with_the_reward_model(stepped):
    """val/reward/overall = the reward function's + weight x val/reward/reward_model: validation with and without the
    reward model on the same prompts and sampling seeds (the same responses)."""
    from easyrl.trainer.validation import Validator

    trainer, _ = stepped
    with_rm = trainer.validator.run(step=1)
    v = trainer.validator
    rule_only = Validator(v.config, v.dataset, v.generator, v.scorer, v.tokenizer).run(step=1)
    assert "val/reward/reward_model" not in rule_only
    assert with_rm["val/response_length/mean"] == rule_only["val/response_length/mean"]
    assert with_rm["val/reward/overall"] == pytest.approx(
        rule_only["val/reward/overall"] + WEIGHT * with_rm["val/reward/reward_model"], abs=1e-6)
    assert with_rm["val/reward/reward_model"] != 0.0
