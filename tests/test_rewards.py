"""easyrl.rewards.function and examples/reward_function/{math,dapo}.py: loading, validation, crafted responses."""

import math
import pickle
import textwrap
from pathlib import Path

import pytest
import torch

from easyrl.rewards.function import RewardFunction, scores_to_token_rewards

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "reward_function"


def _inputs(*responses, ground_truth="80"):
    return [{"response": r, "response_length": len(r), "ground_truth": ground_truth} for r in responses]


@pytest.fixture
def reward_file(tmp_path):
    """A reward file with well-behaved and broken functions."""
    path = tmp_path / "my_reward.py"
    path.write_text(
        textwrap.dedent(
            """
            def batch_fn(reward_inputs, bonus=0.0):
                return [{"overall": float(x["response"] == x["ground_truth"]) + bonus, "length": x["response_length"]}
                        for x in reward_inputs]

            def seq_fn(reward_input, bonus=0.0):
                return {"overall": float(reward_input["response"] == reward_input["ground_truth"]) + bonus}

            def short_fn(reward_inputs):
                return [{"overall": 1.0}]

            def no_overall_fn(reward_inputs):
                return [{"accuracy": 1.0} for _ in reward_inputs]

            def nan_fn(reward_inputs):
                return [{"overall": float("nan")} for _ in reward_inputs]

            def str_fn(reward_inputs):
                return [{"overall": "1"} for _ in reward_inputs]

            def names_fn(reward_inputs):
                return [{"overall": 1.0, "a": 1.0}, {"overall": 1.0, "b": 1.0}]

            def not_list_fn(reward_inputs):
                return {"overall": [1.0] * len(reward_inputs)}

            def not_dict_seq(reward_input):
                return 1.0

            NOT_A_FUNCTION = 3
            """
        )
    )
    return path


def test_batch_and_sequential_functions_with_kwargs(reward_file):
    inputs = _inputs("80", "81", "80")
    out = RewardFunction(f"{reward_file}:batch_fn", {"bonus": 0.5}, "batch")(inputs)
    assert out == {"overall": [1.5, 0.5, 1.5], "length": [2.0, 2.0, 2.0]}
    reward = RewardFunction(f"{reward_file}:seq_fn", {"bonus": 0.25}, "sequential")
    out = reward(inputs)
    assert out == {"overall": [1.25, 0.25, 1.25]}
    assert all(isinstance(v, float) for v in out["overall"])
    assert pickle.loads(pickle.dumps(reward))(inputs) == out  # shipped to other processes by spec


def test_same_file_name_in_two_folders_does_not_clash(tmp_path):
    for folder, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "math.py").write_text(f"def f(xs):\n    return [{{'overall': {value}}} for _ in xs]\n")
    a = RewardFunction(f"{tmp_path / 'a' / 'math.py'}:f")
    b = RewardFunction(f"{tmp_path / 'b' / 'math.py'}:f")
    assert a(_inputs("x"))["overall"] == [1.0] and b(_inputs("x"))["overall"] == [2.0]


@pytest.mark.parametrize(
    "fn, reward_type, pattern",
    [
        ("short_fn", "batch", r"short_fn.*my_reward\.py.*returned 1 score dicts for 2 inputs"),
        ("no_overall_fn", "batch", r"no_overall_fn.*no 'overall' score for row 0"),
        ("nan_fn", "batch", r"nan_fn.*overall=nan for row 0.*finite number"),
        ("str_fn", "batch", r"str_fn.*overall='1' for row 0"),
        ("names_fn", "batch", r"names_fn.*\['b', 'overall'\] for row 1"),
        ("not_list_fn", "batch", r"not_list_fn.*returned a dict, expected a list"),
        ("not_dict_seq", "sequential", r"not_dict_seq.*returned a float for row 0"),
    ],
)
def test_bad_return_values_name_function_file_and_row(reward_file, fn, reward_type, pattern):
    reward = RewardFunction(f"{reward_file}:{fn}", reward_type=reward_type)
    with pytest.raises(ValueError, match=pattern):
        reward(_inputs("80", "1"))


def test_bad_specs(reward_file, tmp_path):
    with pytest.raises(AttributeError, match=r"no function 'main' \(a spec without ':function_name' names 'main'"):
        RewardFunction(str(reward_file))
    with pytest.raises(FileNotFoundError, match="missing_file.py"):
        RewardFunction(f"{tmp_path / 'missing_file.py'}:fn")
    with pytest.raises(AttributeError, match=r"my_reward\.py.*no function 'absent'.*batch_fn"):
        RewardFunction(f"{reward_file}:absent")
    with pytest.raises(AttributeError, match="NOT_A_FUNCTION"):
        RewardFunction(f"{reward_file}:NOT_A_FUNCTION")
    with pytest.raises(ValueError, match="reward_type"):
        RewardFunction(f"{reward_file}:batch_fn", reward_type="parallel")


def test_scores_to_token_rewards_puts_score_on_last_valid_token():
    overall = torch.tensor([0.5, -1.0, 2.0, 3.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    expected = torch.tensor(
        [[0, 0, 0.5, 0], [-1.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 3.0]]  # row 2 has no response token
    )
    assert torch.equal(scores_to_token_rewards(overall, mask), expected)
    with pytest.raises(ValueError, match="bsz"):
        scores_to_token_rewards(overall[:2], mask)


def test_math_reward_on_crafted_responses():
    reward = RewardFunction(f"{EXAMPLES / 'math.py'}:compute_score", {"format_weight": 0.1})
    responses = [
        "<think>arc AB = arc CD, so 80</think> The answer is \\boxed{80}.",  # right, formatted: 0.9 + 0.1
        "<think>guess</think> \\boxed{60}",  # wrong, formatted: 0 + 0.1
        "It is \\boxed{80}",  # right, no think tags: 0.9 + 0
        "<think>x</think> \\boxed{ }",  # empty box: no format, no accuracy
        "<think>x</think> 80",  # no box at all
    ]
    out = reward(_inputs(*responses))
    assert out["format"] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert out["accuracy"] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert out["overall"] == pytest.approx([1.0, 0.1, 0.9, 0.0, 0.0])


def test_math_reward_grades_latex_ground_truths():
    reward = RewardFunction(f"{EXAMPLES / 'math.py'}:compute_score")
    inputs = [
        {"response": "<think>t</think> \\boxed{\\frac{\\sqrt{2}}{10}}", "response_length": 9,
         "ground_truth": "\\frac { \\sqrt { 2 } } { 10 }"},
        {"response": "<think>t</think> \\boxed{5\\sqrt{3}}", "response_length": 9, "ground_truth": "5 \\sqrt { 3 }"},
        {"response": "<think>t</think> \\boxed{5\\sqrt{2}}", "response_length": 9, "ground_truth": "5 \\sqrt { 3 }"},
    ]  # fmt: skip
    assert reward(inputs)["accuracy"] == [1.0, 1.0, 0.0]


def test_dapo_reward_soft_overlong_punishment():
    # L_max = 100, L_cache = 20: no penalty up to 80 tokens, then (80 - |y|) / 20, -1 beyond 100 (DAPO Eq. 13)
    kwargs = {"max_response_length": 100, "overlong_buffer_length": 20, "overlong_penalty_factor": 0.5}
    reward = RewardFunction(f"{EXAMPLES / 'dapo.py'}:compute_score", kwargs)
    right, wrong = "\\boxed{80}", "\\boxed{7}"
    lengths_and_responses = [(50, right), (80, right), (90, right), (100, wrong), (130, wrong)]
    inputs = [{"response": r, "response_length": n, "ground_truth": "80"} for n, r in lengths_and_responses]
    out = reward(inputs)
    penalties = [0.0, 0.0, 0.5 * (80 - 90) / 20, 0.5 * -1.0, 0.5 * -1.0]
    assert out["overlong"] == pytest.approx(penalties)
    assert out["accuracy"] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert out["accuracy_reward"] == [1.0, 1.0, 1.0, -1.0, -1.0]
    assert out["overall"] == pytest.approx([a + p for a, p in zip(out["accuracy_reward"], penalties)])
    assert all(math.isfinite(v) for v in out["overall"])
    with pytest.raises(ValueError, match="overlong_buffer_length"):
        RewardFunction(f"{EXAMPLES / 'dapo.py'}:compute_score", dict(kwargs, overlong_buffer_length=0))(inputs)


def test_reward_scorer_loads_each_function_once_and_scores(reward_file):
    from easyrl.rewards.remote import RewardScorer

    scorer = RewardScorer()  # what the trainer runs as a Ray actor

    def score(spec, kwargs):
        scores, failures = scorer.score_guarded(spec, kwargs, "batch", _inputs("80", "81"), "raise", None, 1)
        assert failures == []
        return scores

    assert score(f"{reward_file}:batch_fn", {"bonus": 0.5})["overall"] == [1.5, 0.5]
    assert score(f"{reward_file}:batch_fn", {"bonus": 0.0})["overall"] == [1.0, 0.0]
    score(f"{reward_file}:batch_fn", {"bonus": 0.5})
    assert len(scorer._guards) == 2
    with pytest.raises(ValueError, match="row 0"):
        score(f"{reward_file}:nan_fn", {})
