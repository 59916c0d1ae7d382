"""docs/errors.md, LLM-judge entries (J..): ``worker.reward.judge.*`` checked by ``load_config`` (values) and before
Ray (``easyrl.trainer.reward_checks.check_judge_files``: model folder, prompt template, parser file), each ending in one
``easyrl: <kind> error: ...`` line naming the key, exit status 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from easyrl.config import load_config
from easyrl.trainer.reward_checks import check_judge_files

REPO = Path(__file__).resolve().parents[1]
KEY = "worker.reward.judge"
ON = f"{KEY}.model_path={REPO / 'tests'}"  # any existing path: the value checks do not read the model


CASES = [
    ("J01", [ON, f"{KEY}.parser=numbers"], [f"{KEY}.parser='numbers'", "number, json", "file.py:function"]),
    ("J02", [ON, f"{KEY}.max_tokens=0"], [f"{KEY}.max_tokens", "positive"]),
    ("J03", [ON, f"{KEY}.gpu_memory_utilization=1.5"], [f"{KEY}.gpu_memory_utilization", "(0, 1]"]),
    ("J04", [ON, f"{KEY}.parser=json", f"{KEY}.json_key="], [f"{KEY}.json_key", "json_key=score"]),
    ("J05", [ON, "trainer.n_gpus_per_node=2", "worker.rollout.tensor_parallel_size=2"],
     [KEY, "worker.rollout.tensor_parallel_size=2", "tensor_parallel_size=1"]),
    ("J12", [ON, f"{KEY}.dtype=float64"], [f"{KEY}.dtype='float64'", "auto, bf16, fp16, fp32"]),
]


@pytest.mark.parametrize("words, culprits", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_judge_config_error(expect_user_error, words, culprits):
    expect_user_error(lambda: load_config(["worker.actor.model.model_path=m", *words]), "config", *culprits)


def _judge(tmp_path, **values):
    config = load_config(["worker.actor.model.model_path=m", f"{KEY}.model_path={tmp_path}"])
    (tmp_path / "config.json").write_text("{}")
    for name, value in values.items():
        setattr(config.worker.reward.judge, name, value)
    return config.worker.reward.judge


def test_judge_model_folder_that_does_not_exist(expect_user_error, tmp_path):  # J06
    judge = _judge(tmp_path)
    judge.model_path = str(tmp_path / "no_judge")
    expect_user_error(lambda: check_judge_files(judge), "model", f"{KEY}.model_path", "no_judge")


def test_judge_template_that_does_not_exist(expect_user_error, tmp_path):  # J07
    judge = _judge(tmp_path, prompt_template=str(tmp_path / "nope.jinja"))
    expect_user_error(lambda: check_judge_files(judge), "config", f"{KEY}.prompt_template", "nope.jinja",
                      "easyrl/rewards/judge.jinja")


def test_judge_template_with_a_syntax_error_names_the_line(expect_user_error, tmp_path):  # J08
    (tmp_path / "bad.jinja").write_text("Problem: {{ problem }}\nAnswer: {{ response }\n")
    judge = _judge(tmp_path, prompt_template=str(tmp_path / "bad.jinja"))
    expect_user_error(lambda: check_judge_files(judge), "config", f"{KEY}.prompt_template", "bad.jinja", "line 2")


def test_judge_template_with_an_unknown_variable(expect_user_error, tmp_path):  # J09
    (tmp_path / "t.jinja").write_text("{{ question }} {{ response }}")
    judge = _judge(tmp_path, prompt_template=str(tmp_path / "t.jinja"))
    expect_user_error(lambda: check_judge_files(judge), "config", f"{KEY}.prompt_template", "question",
                      "problem, response, ground_truth")


def test_judge_parser_file_that_does_not_exist(expect_user_error, tmp_path):  # J10
    judge = _judge(tmp_path, parser=f"{tmp_path}/parse.py:score")
    expect_user_error(lambda: check_judge_files(judge), "config", f"{KEY}.parser", "parse.py", "does not exist")


def test_judge_parser_file_without_the_function(expect_user_error, tmp_path):  # J11
    (tmp_path / "parse.py").write_text("def other(verdict):\n    return 1.0\n")
    judge = _judge(tmp_path, parser=f"{tmp_path}/parse.py:score")
    expect_user_error(lambda: check_judge_files(judge), "config", f"{KEY}.parser", "'score'", "other")
