"""docs/errors.md, on-policy distillation entries (T..): a bad distillation setting or a teacher whose tokenizer does
not read the student's token ids is refused with one ``easyrl: <kind> error:`` line before Ray or any worker starts
(``load_config``, then ``easyrl.trainer.preflight.prepare`` / ``easyrl.trainer.model_checks``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from easyrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
BASE = [f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m"]

CONFIG_CASES = [
    ("T01", ["algorithm.distill_coef=-1", "worker.teacher.model.model_path=t"],
     ["algorithm.distill_coef", "0 or more", "-1"]),
    ("T02", ["algorithm.distill_coef=0.5"], ["algorithm.distill_coef=0.5", "worker.teacher.model.model_path"]),
    ("T03", ["algorithm.adv_estimator=on_policy_distill", "algorithm.distill_coef=1",
             "worker.teacher.model.model_path=t"],
     ["algorithm.adv_estimator=on_policy_distill", "algorithm.distill_coef=1", "algorithm.distill_coef=0"]),
]


@pytest.mark.parametrize("cid, overrides, culprits", CONFIG_CASES, ids=[case[0] for case in CONFIG_CASES])
def test_distill_config_error(expect_user_error, cid, overrides, culprits):
    expect_user_error(lambda: load_config([*BASE, *overrides]), "config", *culprits)


@pytest.fixture(scope="module")
def student() -> Path:
    from easyrl.testing.tiny import build_tiny_smollm2_student

    return build_tiny_smollm2_student()


def _prepare(student: Path, teacher: Path, tmp_path: Path):
    from easyrl.trainer.preflight import prepare

    data = REPO / "examples" / "data" / "digit_addition"
    config = load_config([
        f"config={REPO / 'examples/configs/smollm2_learn.yaml'}", f"worker.actor.model.model_path={student}",
        f"data.train_files={data / 'train.jsonl'}", f"data.val_files={data / 'val.jsonl'}",
        f"worker.reward.reward_function={REPO / 'examples/reward_function/last_number.py'}:compute_score",
        "algorithm.adv_estimator=on_policy_distill", f"worker.teacher.model.model_path={teacher}",
        f"trainer.runs_root={tmp_path}",
    ])
    return lambda: prepare(config)


def _altered_copy(student: Path, tmp_path: Path, edit) -> Path:
    """The student's config and tokenizer files in a new folder, ``edit(folder)`` applied (its weights linked: the
    check reads the tokenizer only, and a folder without weights is refused first)."""
    folder = tmp_path / "teacher"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(student / name, folder / name)
    (folder / "model.safetensors").symlink_to(student / "model.safetensors")
    edit(folder)
    return folder


def test_teacher_that_does_not_exist(expect_user_error, student, tmp_path):  # T04
    expect_user_error(_prepare(student, tmp_path / "no-teacher", tmp_path), "model",
                      "worker.teacher.model.model_path", "no-teacher")


def test_teacher_with_another_vocabulary(expect_user_error, student, tiny_model_path, tmp_path):  # T05
    qwen = tiny_model_path("qwen2_5")  # Qwen2.5's 151k-token vocabulary against SmolLM2's 49152
    line = expect_user_error(_prepare(student, qwen, tmp_path), "config", str(qwen), str(student),
                             "different vocabularies", "49152 tokens for the student")
    assert "worker.teacher.model" in line and "worker.actor.model" in line


def test_teacher_with_other_special_tokens(expect_user_error, student, tmp_path):  # T06
    def edit(folder: Path) -> None:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["eos_token"] = "<|endoftext|>"
        (folder / "tokenizer_config.json").write_text(json.dumps(config))

    teacher = _altered_copy(student, tmp_path, edit)
    expect_user_error(_prepare(student, teacher, tmp_path), "config", str(teacher), str(student),
                      "eos_token is '<|endoftext|>' for the teacher and '<|im_end|>' for the student")


def test_teacher_with_another_chat_template(expect_user_error, student, tmp_path):  # T07
    def edit(folder: Path) -> None:
        template = (folder / "chat_template.jinja").read_text()
        (folder / "chat_template.jinja").write_text(template.replace("<|im_start|>", "<|im_start|> "))

    teacher = _altered_copy(student, tmp_path, edit)
    expect_user_error(_prepare(student, teacher, tmp_path), "config", str(teacher), str(student),
                      "different chat templates", "data.override_chat_template")


def test_compatible_teacher_passes(student, tmp_path):
    from easyrl.testing.smollm2 import smollm2_path

    prepared = _prepare(student, smollm2_path(), tmp_path)()  # the real SmolLM2-135M-Instruct over its tiny student
    assert prepared.train_dataset is not None
