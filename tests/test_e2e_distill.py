"""End to end, on-policy distillation (issues #23, #53): two teachers on two data sources (``worker.teachers``, MOPD):
SmolLM2-135M-Instruct (``easyrl.testing.smollm2``) scores the ``add_a`` rows, a second random-weight model of its
tokenizer (``easyrl.testing.tiny.build_tiny_smollm2_student`` with another seed) the ``add_b`` rows, teaching a tiny
random-weight student with that tokenizer, pure distillation (``algorithm.adv_estimator=on_policy_distill``) through
the real path: pre-flight (every teacher's tokenizer checked, every row's source served), Ray, the FSDP2 actor and
teacher roles on 2 ranks (each rank's share holds one source's samples only, and it still runs the other teacher
beside its peer), vLLM sampling. One trainer for the module, one step; the reported ``distill/reverse_kl`` (overall and
per teacher) and each sample's teacher log-probs are checked against its own source's teacher run directly with
transformers on the step's samples. (An incompatible teacher is refused before the workers start:
``tests/test_errors_distill.py``.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
LOGPROB_TOL = 2e-3  # fp32: the workers' packed forward against transformers' padded one


# the rows' data_source, two by two (rows 0-1 add_a, 2-3 add_b, ...); add_a -> teacher a, add_b -> teacher b: the
# step's 8 samples in dispatch order are 4 of teacher a then 4 of teacher b, so each rank's share holds one teacher's
# samples only, and each rank still runs the other teacher (its FSDP gathers) beside its peer (filler forwards)
SOURCES = ("add_a", "add_b")


@pytest.fixture(scope="module")
def distill_step(trainer_on_ray, tmp_path_factory):
    from easyrl.config import load_config
    from easyrl.testing.smollm2 import smollm2_path
    from easyrl.testing.tiny import build_tiny_smollm2_student

    tmp = tmp_path_factory.mktemp("two_teachers")
    student = build_tiny_smollm2_student()
    teachers = {"a": smollm2_path(), "b": build_tiny_smollm2_student(output_dir=tmp / "teacher_b", seed=1)}
    rows = (REPO / "examples" / "data" / "digit_addition" / "train.jsonl").read_text().splitlines()
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps({**json.loads(row), "data_source": SOURCES[i // 2 % 2]}) + "\n"
                            for i, row in enumerate(rows)))
    config = load_config([
        f"config={REPO / 'examples/configs/smollm2_learn.yaml'}", f"worker.actor.model.model_path={student}",
        *(f"worker.teachers.{name}.{key}" for name, source in zip(teachers, SOURCES)
          for key in (f"model.model_path={teachers[name]}", f"data_sources=[{source}]")),
        "algorithm.adv_estimator=on_policy_distill", "algorithm.use_kl_loss=false", "algorithm.disable_kl=true",
        f"data.train_files={data}", "data.shuffle=false",  # the step's 4 prompts: rows 0-3, both sources
        "data.val_files=null", "data.max_response_length=16",
        "data.rollout_batch_size=4", "worker.actor.global_batch_size=4", "worker.rollout.n=2",
        "worker.actor.micro_batch_size_per_device_for_update=4",
        "trainer.n_gpus_per_node=2", "trainer.cpu_threads_per_worker=1",  # 2 ranks: each holds both teachers
        "trainer.balance_batch=false",  # the dispatch order kept: rank 0 gets teacher a's samples, rank 1 b's
        "trainer.val_before_train=false", f"trainer.runs_root={tmp_path_factory.mktemp('runs')}",
    ])
    with trainer_on_ray(config) as trainer:
        assert len(trainer.workers.workers) == 2
        trainer.global_step = 1
        metrics = trainer.train_step(iter(trainer.train_dataloader))
        yield metrics, trainer.last_batch, student, teachers


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


@pytest.fixture(scope="module")
def direct(distill_step) -> dict[str, torch.Tensor]:
    """The step's samples scored with transformers directly, once: name -> ``(bsz, resp_len)`` log-probs of the
    student (``student``) and of each teacher on every sample."""
    _, batch, student, teachers = distill_step
    return {"student": _hf_log_probs(student, batch), **{name: _hf_log_probs(path, batch)
                                                        for name, path in teachers.items()}}


def _own(direct: dict, batch, owner: dict) -> tuple[torch.Tensor, list[str]]:
    """Each sample's row of ``direct[owner[its source]]`` (``(bsz, resp_len)``), and each sample's owner."""
    names = [owner[row["data_source"]] for row in batch["columns"]]
    return torch.stack([direct[name][i] for i, name in enumerate(names)]), names


def test_reverse_kl_is_student_minus_teacher_log_probs_of_the_sampled_tokens(distill_step, direct):
    metrics, batch, _, teachers = distill_step
    mask = batch["response_mask"].bool()
    teacher_direct, names = _own(direct, batch, dict(zip(SOURCES, teachers)))  # each sample's own teacher
    assert set(names) == {"a", "b"}  # both teachers had samples this step
    student_direct = direct["student"]  # step 1 samples with the initial weights (the checkpoint's)
    assert (batch["teacher_log_probs"] - teacher_direct)[mask].abs().max() < LOGPROB_TOL
    assert (batch["old_log_probs"] - student_direct)[mask].abs().max() < LOGPROB_TOL
    gap = student_direct - teacher_direct
    assert metrics["distill/reverse_kl"] == pytest.approx(gap[mask].mean().item(), abs=LOGPROB_TOL)
    for name in teachers:  # each teacher's own samples
        own = mask & torch.tensor([n == name for n in names]).unsqueeze(-1)
        assert metrics[f"distill/reverse_kl/{name}"] == pytest.approx(gap[own].mean().item(), abs=LOGPROB_TOL)
    # a random student against a real instruct model: far apart (nats per token)
    assert metrics["distill/reverse_kl/a"] > 1.0


def test_each_sample_is_scored_by_its_own_sources_teacher_only(distill_step, direct):
    _, batch, _, teachers = distill_step
    mask = batch["response_mask"].bool()
    _, names = _own(direct, batch, dict(zip(SOURCES, teachers)))
    assert batch["teacher_index"].tolist() == [list(teachers).index(name) for name in names]
    other, _ = _own(direct, batch, dict(zip(SOURCES, reversed(teachers))))  # the other source's teacher
    # the two teachers differ on these samples, so matching the own teacher (above) is a real check
    assert (batch["teacher_log_probs"] - other)[mask].abs().max() > 100 * LOGPROB_TOL


def test_pure_distillation_trains_on_the_negative_reverse_kl(distill_step):
    metrics, batch, _, _ = distill_step
    mask = batch["response_mask"]
    expected = -(batch["old_log_probs"] - batch["teacher_log_probs"]) * mask
    assert torch.allclose(batch["advantages"], expected)
    for key in ("timing_s/teacher", "timing_s/old_log_prob", "actor/pg_loss", "actor/grad_norm"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert "timing_s/ref" not in metrics  # no KL term: no reference pass
    assert metrics["actor/grad_norm"] > 0
