"""Reward files of EasyR1, verl and TRL score in easyrl as in those libraries (easyrl/rewards/styles.py, the examples
in examples/reward_function/, docs/migrating.md): EasyR1's ``REWARD_TYPE`` and ``file.py`` = ``file.py:main``,
verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)`` per sample, TRL's
``fn(completions, **columns) -> list[float]`` per batch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from easyrl.config.worker import RewardConfig
from easyrl.rewards.function import RewardFunction
from easyrl.trainer.reward_checks import load_reward

REPO = Path(__file__).resolve().parents[1]
VERL = REPO / "examples" / "reward_function" / "verl_style.py"
TRL = REPO / "examples" / "reward_function" / "trl_style.py"


def _input(response: str, ground_truth: str, **columns) -> dict:
    return {"response": response, "response_length": len(response), "ground_truth": ground_truth,
            "columns": columns}


def _file(tmp_path: Path, body: str, name: str = "reward") -> Path:
    path = tmp_path / f"{name}.py"  # one name per file: a file is imported once per process
    path.write_text(textwrap.dedent(body))
    return path


def test_verl_file_scores_as_verl(monkeypatch):
    reward = RewardFunction(f"{VERL}:compute_score", {"format_score": 0.1})
    assert (reward.style, reward.reward_type) == ("verl", "sequential")
    inputs = [
        _input("so \\boxed{4}", "9", data_source="gsm8k", reward_model={"ground_truth": "4"}, extra_info={"i": 0}),
        _input("so \\boxed{5}", "5", data_source="gsm8k", reward_model={"ground_truth": "4"}),
        _input("no box", "4"),
        _input("\\boxed{\\frac{1}{2}}", "0.5"),  # no reward_model column: data.answer_key's column
    ]
    calls = []
    original = reward.fn
    monkeypatch.setattr(reward, "fn", lambda **kw: calls.append(kw) or original(**kw))
    scores = reward(inputs)
    # verl: reward = score (1 correct, format_score for a wrong boxed answer, 0 without a box); acc logged
    assert scores == {"overall": [1.0, 0.1, 0.0, 1.0], "acc": [1.0, 0.0, 0.0, 1.0]}
    assert len(calls) == 4  # once per response, with verl's keywords
    assert calls[0] == {"data_source": "gsm8k", "solution_str": "so \\boxed{4}", "ground_truth": "4",
                        "extra_info": {"i": 0}, "format_score": 0.1}
    assert (calls[2]["data_source"], calls[2]["extra_info"], calls[3]["ground_truth"]) == ("", {}, "0.5")


def test_trl_file_scores_as_trl(tmp_path):
    reward = RewardFunction(f"{TRL}:accuracy_reward")
    assert (reward.style, reward.reward_type) == ("trl", "batch")
    inputs = [_input("\\boxed{3}", "3", prompt="1+2?", solution="3"),
              _input("\\boxed{4}", "3", prompt="1+2?", solution="3"),
              _input("3", "3", prompt="1+2?", solution="3"),
              _input("\\boxed{3}", "", prompt="?", solution="")]
    assert reward(inputs) == {"overall": [1.0, 0.0, 0.0, 0.0]}  # None (no solution) scores 0, as TRL's nansum
    # how TRL calls it: keywords prompts, completions and each dataset column as a list; conversations as messages
    path = _file(tmp_path, """
        SEEN = []
        def rec(prompts, completions, solution, level, **kwargs):
            SEEN.append(dict(prompts=prompts, completions=completions, solution=solution, level=level, **kwargs))
            return [float(len(c[0]["content"])) for c in completions]
    """)
    spy = RewardFunction(f"{path}:rec", {"scale": 2})
    chat = [{"role": "user", "content": "hi"}]
    assert spy([_input("ab", "x", prompt=chat, solution="x", level=1),
                _input("abc", "y", prompt=chat, solution="y", level=2)]) == {"overall": [2.0, 3.0]}
    seen = __import__("sys").modules[spy.fn.__module__].SEEN[-1]
    assert seen == {"prompts": [chat, chat], "completions": [[{"role": "assistant", "content": "ab"}],
                                                           [{"role": "assistant", "content": "abc"}]],
                    "solution": ["x", "y"], "level": [1, 2], "scale": 2}


def test_style_detection_and_declaration(tmp_path):
    path = _file(tmp_path, """
        REWARD_STYLE = "easyrl"
        def compute_score(completions):  # would look like TRL, but the file declares easyrl
            return [{"overall": 1.0} for _ in completions]
    """)
    assert RewardFunction(f"{path}:compute_score").style == "easyrl"
    undeclared = _file(tmp_path, """
        def verl_like(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0
        def trl_like(prompts, completions, **kwargs):
            return [1.0] * len(completions)
        def plain(reward_inputs):
            return [{"overall": 1.0} for _ in reward_inputs]
    """, "undeclared")
    assert [RewardFunction(f"{undeclared}:{name}").style for name in ("verl_like", "trl_like", "plain")] == [
        "verl", "trl", "easyrl"]
    bad = _file(tmp_path, 'REWARD_STYLE = "x"\ndef main(r):\n    return 1\n', "bad")
    with pytest.raises(ValueError, match="REWARD_STYLE"):
        RewardFunction(str(bad))


def test_reward_type_from_the_file_and_main_by_default(tmp_path):
    path = _file(tmp_path, """
        REWARD_TYPE = "sequential"
        def main(reward_input):
            return {"overall": float(reward_input["response"] == reward_input["ground_truth"])}
    """)
    reward = RewardFunction(str(path))  # no ':name': main, as in EasyR1
    assert (reward.name, reward.reward_type) == ("main", "sequential")
    assert reward([_input("a", "a"), _input("b", "a")]) == {"overall": [1.0, 0.0]}
    assert RewardFunction(str(path), reward_type="batch").reward_type == "batch"  # an explicit setting wins
    assert load_reward(RewardConfig(reward_function=str(path))).reward_type == "sequential"  # config default: auto


def test_verl_kwargs_checked_against_its_signature(expect_user_error):
    config = RewardConfig(reward_function=f"{VERL}:compute_score", reward_function_kwargs={"fromat_score": 0.1})
    expect_user_error(lambda: load_reward(config), "reward", "verl_style.py", "compute_score", "fromat_score",
                      "verl's compute_score")


def test_preflight_tries_a_verl_reward_on_a_training_row(e2e_text_config, tmp_path):
    """``prepare`` (before Ray) calls a verl-style function on the first training row, its columns included."""
    from easyrl.trainer.preflight import prepare

    ready = prepare(e2e_text_config(tmp_path, f"worker.reward.reward_function={VERL}:compute_score"))
    assert ready.reward_fn.style == "verl" and ready.reward_fn.reward_type == "sequential"
    columns = ready.train_dataset[0]["columns"]
    assert "prompt" in columns and "answer" in columns and "images" not in columns
