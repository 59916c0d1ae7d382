"""docs/errors.md, reward entries (R..): ``worker.reward.*`` checked before Ray (file, function, keyword arguments
against the signature, the declared ``reward_type`` on one sample), each ending in one ``easyrl: reward error: ...``
line naming the function or key, exit status 2, no traceback."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from easyrl.config import RewardConfig, load_config
from easyrl.trainer.reward_checks import check_filter_key, check_reward_on_sample, load_reward

REPO = Path(__file__).resolve().parents[1]
LETTERS = REPO / "tests" / "reward_functions" / "letters.py"  # a batch function: compute_score(reward_inputs, scale)
SAMPLE = {"response": "<think>t</think> \\boxed{80}", "response_length": 9, "ground_truth": "80"}
KEY = "worker.reward.reward_function"


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "my_reward.py"
    path.write_text(textwrap.dedent("""
        def per_sample(reward_input, bonus=0.0):
            return {"overall": float(reward_input["response"] == reward_input["ground_truth"]) + bonus}

        def needs_target(reward_inputs, target):
            return [{"overall": float(target)} for _ in reward_inputs]

        def no_overall(reward_inputs):
            return [{"accuracy": 1.0} for _ in reward_inputs]

        def no_arguments():
            return []
        """))
    return path


def _reward(spec, kwargs=None, reward_type="batch") -> RewardConfig:
    return RewardConfig(reward_type=reward_type, reward_function=str(spec), reward_function_kwargs=kwargs or {})


def test_reward_function_not_set(expect_user_error):  # R01
    expect_user_error(lambda: load_reward(RewardConfig()), "reward", KEY, "not set", "path/to/file.py:function_name")


def test_spec_without_function_name(expect_user_error):  # R02
    expect_user_error(lambda: load_reward(_reward(LETTERS)), "reward", KEY, "letters.py", "no function 'main'",
                      "names 'main', as in EasyR1", "compute_score")


def test_reward_file_missing(expect_user_error, tmp_path):  # R03
    spec = f"{tmp_path / 'nope.py'}:compute_score"
    expect_user_error(lambda: load_reward(_reward(spec)), "reward", KEY, "nope.py", "does not exist")


def test_reward_function_missing(expect_user_error):  # R04
    expect_user_error(lambda: load_reward(_reward(f"{LETTERS}:compute")), "reward", KEY, "no function 'compute'",
                      "compute_score")


def test_kwargs_typo_against_the_signature(expect_user_error):  # R05
    load = lambda: load_reward(_reward(f"{LETTERS}:compute_score", {"scael": 2.0}))  # noqa: E731
    expect_user_error(load, "reward", "worker.reward.reward_function_kwargs", "'scael'", "compute_score",
                      "did you mean 'scale'")


def test_required_kwarg_not_given(expect_user_error, reward_file):  # R06
    expect_user_error(lambda: load_reward(_reward(f"{reward_file}:needs_target")), "reward", "needs_target",
                      "worker.reward.reward_function_kwargs", "target")


def test_sequential_declared_for_a_batch_function(expect_user_error):  # R07
    reward = load_reward(_reward(f"{LETTERS}:compute_score", reward_type="sequential"))
    expect_user_error(lambda: check_reward_on_sample(reward, SAMPLE), "reward", "'compute_score'", "letters.py",
                      "worker.reward.reward_type=sequential", "set worker.reward.reward_type=batch")


def test_batch_declared_for_a_sequential_function(expect_user_error, reward_file):  # R08
    reward = load_reward(_reward(f"{reward_file}:per_sample"))
    expect_user_error(lambda: check_reward_on_sample(reward, SAMPLE), "reward", "'per_sample'", "my_reward.py",
                      "worker.reward.reward_type=batch", "set worker.reward.reward_type=sequential")


def test_reward_file_with_a_syntax_error(expect_user_error, tmp_path):  # R09
    path = tmp_path / "broken.py"
    path.write_text("def compute_score(reward_inputs):\n    return [\n")
    expect_user_error(lambda: load_reward(_reward(f"{path}:compute_score")), "reward", KEY, "broken.py",
                      "SyntaxError")


def test_reward_file_that_fails_to_import(expect_user_error, tmp_path):  # R10
    path = tmp_path / "needs_pkg.py"
    path.write_text("import math\nimport easyrl_no_such_package\n\n\ndef compute_score(xs):\n    return []\n")
    expect_user_error(lambda: load_reward(_reward(f"{path}:compute_score")), "reward", KEY, "needs_pkg.py line 2",
                      "easyrl_no_such_package")


def test_no_overall_score_on_the_sample(expect_user_error, reward_file):  # R11
    reward = load_reward(_reward(f"{reward_file}:no_overall"))
    expect_user_error(lambda: check_reward_on_sample(reward, SAMPLE), "reward", "'no_overall'", "'overall'")


def test_function_without_an_argument_for_the_inputs(expect_user_error, reward_file):  # R12
    expect_user_error(lambda: load_reward(_reward(f"{reward_file}:no_arguments")), "reward", "'no_arguments'",
                      "no positional argument")


def test_filter_key_that_the_reward_does_not_return(expect_user_error):  # R13
    config = load_config([f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m",
                          "algorithm.online_filtering=true", "algorithm.filter_key=acc"])
    reward = load_reward(_reward(f"{LETTERS}:compute_score"))
    names = check_reward_on_sample(reward, SAMPLE)
    assert names == ["overall", "length"]
    expect_user_error(lambda: check_filter_key(config, names, reward.where), "config", "algorithm.filter_key='acc'",
                      "['overall', 'length']")


def test_well_formed_rewards_pass(reward_file):
    reward = load_reward(_reward(f"{reward_file}:per_sample", {"bonus": 0.5}, "sequential"))
    assert check_reward_on_sample(reward, SAMPLE) == ["overall"]
    assert reward([SAMPLE]) == {"overall": [0.5]}  # the response is not the bare ground truth


def test_verl_style_kwargs_that_do_not_bind(expect_user_error):  # R20
    """A verl ``compute_score`` is called with verl's keywords plus reward_function_kwargs; a typo is caught before
    Ray against that call (easyrl/rewards/styles.py)."""
    spec = f"{REPO / 'examples/reward_function/verl_style.py'}:compute_score"
    expect_user_error(lambda: load_reward(_reward(spec, {"fromat_score": 0.1})), "reward", "verl_style.py",
                      "verl's compute_score(data_source, solution_str, ground_truth, extra_info)", "fromat_score")


def test_best_metric_that_the_validation_never_logs(expect_user_error, e2e_text_config, tmp_path):  # R14
    """The pre-flight knows the validation's names from the reward's scores on a sample (letters.py: overall,
    length)."""
    from easyrl.trainer.preflight import prepare

    config = e2e_text_config(tmp_path, "trainer.best_metric=val/reward/lenght")
    expect_user_error(lambda: prepare(config), "config", "trainer.best_metric='val/reward/lenght'",
                      "Did you mean 'val/reward/length'?", "val/reward/overall, val/reward/length")
    config = e2e_text_config(tmp_path, "trainer.best_metric=val/acc")
    expect_user_error(lambda: prepare(config), "config", "trainer.best_metric='val/acc'", "val/response_length/mean")
    prepare(e2e_text_config(tmp_path, "trainer.best_metric=val/reward/length"))  # a name it logs, or one outside val/
    prepare(e2e_text_config(tmp_path, "trainer.best_metric=reward/overall"))
