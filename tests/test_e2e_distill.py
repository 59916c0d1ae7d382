"""End to end, on-policy distillation (issue #23): SmolLM2-135M-Instruct (``easyrl.testing.smollm2``) teaches a tiny
random-weight student with its tokenizer (``easyrl.testing.tiny.build_tiny_smollm2_student``), pure distillation
(``algorithm.adv_estimator=on_policy_distill``) through the real path: pre-flight (the tokenizers checked), Ray, the
FSDP2 actor and teacher roles, vLLM sampling. One trainer for the module, one step; the reported
``distill/reverse_kl`` and the teacher's log-probs are checked against transformers run directly on the step's
samples. (An incompatible teacher is refused before the workers start: ``tests/test_errors_distill.py``.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
LOGPROB_TOL = 2e-3  # fp32: the workers' packed forward against transformers' padded one


@pytest.fixture(scope="module")
def distill_step(trainer_on_ray, tmp_path_factory):
    from easyrl.config import load_config
    from easyrl.testing.smollm2 import smollm2_path
    from easyrl.testing.tiny import build_tiny_smollm2_student

    student, teacher = build_tiny_smollm2_student(), smollm2_path()
    data = REPO / "examples" / "data" / "digit_addition"
    config = load_config([
        f"config={REPO / 'examples/configs/smollm2_learn.yaml'}",
        f"worker.actor.model.model_path={student}", f"worker.teacher.model.model_path={teacher}",
        "algorithm.adv_estimator=on_policy_distill", "algorithm.use_kl_loss=false", "algorithm.disable_kl=true",
        f"data.train_files={data / 'train.jsonl'}", "data.val_files=null", "data.max_response_length=16",
        "data.rollout_batch_size=4", "worker.actor.global_batch_size=4", "worker.rollout.n=2",
        "worker.actor.micro_batch_size_per_device_for_update=8",
        "trainer.val_before_train=false", f"trainer.runs_root={tmp_path_factory.mktemp('runs')}",
    ])
    with trainer_on_ray(config) as trainer:
        trainer.global_step = 1
        metrics = trainer.train_step(iter(trainer.train_dataloader))
        yield metrics, trainer.last_batch, student, teacher


def _hf_log_probs(model_path: Path, batch) -> torch.Tensor:
    """Log-probs of the batch's response tokens under the checkpoint at ``model_path``, with transformers on the
    padded batch (left-padded prompts: positions count the real tokens), ``(bsz, resp_len)``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    mask = batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=positions).logits
    resp_len = batch["responses"].shape[1]
    logits = logits[:, -resp_len - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def test_reverse_kl_is_student_minus_teacher_log_probs_of_the_sampled_tokens(distill_step):
    metrics, batch, student, teacher = distill_step
    mask = batch["response_mask"].bool()
    teacher_direct = _hf_log_probs(teacher, batch)
    student_direct = _hf_log_probs(student, batch)  # step 1 samples with the initial weights (the checkpoint's)
    assert (batch["teacher_log_probs"] - teacher_direct)[mask].abs().max() < LOGPROB_TOL
    assert (batch["old_log_probs"] - student_direct)[mask].abs().max() < LOGPROB_TOL
    direct = (student_direct - teacher_direct)[mask].mean().item()
    assert metrics["distill/reverse_kl"] == pytest.approx(direct, abs=LOGPROB_TOL)
    # a random student against a real instruct model: far apart (nats per token)
    assert metrics["distill/reverse_kl"] > 1.0


def test_pure_distillation_trains_on_the_negative_reverse_kl(distill_step):
    metrics, batch, _, _ = distill_step
    mask = batch["response_mask"]
    expected = -(batch["old_log_probs"] - batch["teacher_log_probs"]) * mask
    assert torch.allclose(batch["advantages"], expected)
    for key in ("timing_s/teacher", "timing_s/old_log_prob", "actor/pg_loss", "actor/grad_norm"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert "timing_s/ref" not in metrics  # no KL term: no reference pass
    assert metrics["actor/grad_norm"] > 0
