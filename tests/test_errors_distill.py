"""docs/errors.md, on-policy distillation entries (T..): a bad distillation setting, a teacher whose tokenizer does
not read the student's token ids, or (several teachers, ``worker.teachers``) a data source without its teacher is
refused with one ``easyrl: <kind> error:`` line before Ray or any worker starts (``load_config``, then
``easyrl.trainer.preflight.prepare`` / ``easyrl.trainer.model_checks``)."""

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


MATH = ["algorithm.adv_estimator=on_policy_distill", "worker.teachers.math.model.model_path=t",
        "worker.teachers.math.data_sources=[gsm8k]"]
CHAT = ["worker.teachers.chat.model.model_path=u", "worker.teachers.chat.default=true"]
CONFIG_CASES += [
    ("T08", [*MATH, *CHAT, "worker.teachers.chat.data_sources=[gsm8k]"],
     ["'gsm8k'", "worker.teachers.math.data_sources", "worker.teachers.chat.data_sources"]),
    ("T09", [*MATH, "worker.teachers.chat.model.model_path=u"], ["worker.teachers.chat serves no data source",
                                                                 "worker.teachers.chat.default=true"]),
    ("T10", [*MATH[1:], "algorithm.adv_estimator=grpo"], ["worker.teachers (math)", "distillation is off",
                                                          "algorithm.distill_coef"]),
    ("T11", [*MATH, *CHAT, "worker.teachers.math.default=true"],
     ["worker.teachers.math.default=true", "worker.teachers.chat.default=true", "at most one"]),
    ("T12", [*MATH, "worker.teacher.model.model_path=t"], ["worker.teacher.model.model_path", "worker.teachers"]),
    ("T13", [*MATH, "worker.teachers.chat.default=true"], ["worker.teachers.chat.model.model_path"]),
    ("T14", [*MATH, "worker.teachers.math.modle.model_path=t"], ["worker.teachers.math.modle",
                                                                 "worker.teachers.math.model"]),
]


@pytest.mark.parametrize("cid, overrides, culprits", CONFIG_CASES, ids=[case[0] for case in CONFIG_CASES])
def test_distill_config_error(expect_user_error, cid, overrides, culprits):
    expect_user_error(lambda: load_config([*BASE, *overrides]), "config", *culprits)


def test_a_teacher_name_with_a_dot(expect_user_error, tmp_path):  # T17
    from omegaconf import OmegaConf

    config = OmegaConf.load(REPO / "examples/configs/cpu_demo.yaml")
    OmegaConf.update(config, "worker.teachers", {"math.v2": {"model": {"model_path": "t"}, "default": True}},
                     force_add=True)
    OmegaConf.update(config, "algorithm.adv_estimator", "on_policy_distill")
    OmegaConf.save(config, tmp_path / "dotted.yaml")
    expect_user_error(lambda: load_config([f"config={tmp_path / 'dotted.yaml'}", "worker.actor.model.model_path=m"]),
                      "config", "a teacher named 'math.v2'", "rename it, e.g. 'math_v2'")


@pytest.fixture(scope="module")
def student() -> Path:
    from easyrl.testing.tiny import build_tiny_smollm2_student

    return build_tiny_smollm2_student()


def _prepare(student: Path, teacher: Path, tmp_path: Path, *overrides: str):
    """``prepare`` of a pure-distillation run of ``student`` on digit_addition with ``teacher`` as ``worker.teacher``
    (``teacher`` None: ``overrides`` give the teachers)."""
    from easyrl.trainer.preflight import prepare

    data = REPO / "examples" / "data" / "digit_addition"
    config = load_config([
        f"config={REPO / 'examples/configs/smollm2_learn.yaml'}", f"worker.actor.model.model_path={student}",
        f"data.train_files={data / 'train.jsonl'}", f"data.val_files={data / 'val.jsonl'}",
        f"worker.reward.reward_function={REPO / 'examples/reward_function/last_number.py'}:compute_score",
        "algorithm.adv_estimator=on_policy_distill", f"trainer.runs_root={tmp_path}",
        *([f"worker.teacher.model.model_path={teacher}"] if teacher is not None else []), *overrides,
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


def _sourced_data(tmp_path: Path, sources: list[str]) -> Path:
    """digit_addition's training rows with a ``data_source`` column cycling through ``sources``."""
    rows = (REPO / "examples" / "data" / "digit_addition" / "train.jsonl").read_text().splitlines()
    path = tmp_path / "sourced.jsonl"
    path.write_text("".join(json.dumps({**json.loads(row), "data_source": sources[i % len(sources)]}) + "\n"
                            for i, row in enumerate(rows)))
    return path


def test_each_of_several_teachers_is_checked(expect_user_error, student, tiny_model_path, tmp_path):  # T15
    from easyrl.testing.smollm2 import smollm2_path

    qwen = tiny_model_path("qwen2_5")  # the second teacher reads other token ids
    line = expect_user_error(_prepare(student, None, tmp_path, f"worker.teachers.a.model.model_path={smollm2_path()}",
                                      "worker.teachers.a.default=true", f"worker.teachers.b.model.model_path={qwen}",
                                      "worker.teachers.b.data_sources=[other]"),
                             "config", str(qwen), "(worker.teachers.b.model)", "different vocabularies")
    assert "worker.actor.model" in line


def test_data_source_no_teacher_serves(expect_user_error, student, tmp_path):  # T16
    from easyrl.testing.smollm2 import smollm2_path

    data = _sourced_data(tmp_path, ["add", "add", "sum"])
    expect_user_error(_prepare(student, None, tmp_path, f"data.train_files={data}",
                               f"worker.teachers.a.model.model_path={smollm2_path()}",
                               "worker.teachers.a.data_sources=[add]"),
                      "data", f"data.train_files='{data}', row 2,", "data_source='sum'",
                      "worker.teachers.a.data_sources=['add']", "default")


def test_several_teachers_covering_every_source_pass(student, tmp_path):
    from easyrl.testing.smollm2 import smollm2_path

    data = _sourced_data(tmp_path, ["add", "sum"])
    prepared = _prepare(student, None, tmp_path, f"data.train_files={data}",
                        f"worker.teachers.a.model.model_path={smollm2_path()}", "worker.teachers.a.data_sources=[add]",
                        f"worker.teachers.b.model.model_path={smollm2_path()}", "worker.teachers.b.default=true")()
    assert prepared.train_dataset is not None
