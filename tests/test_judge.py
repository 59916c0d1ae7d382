"""The LLM judge's pure parts (issue #23): verdict parsers, the unparseable count, the Jinja judge prompt, the config
section, the engine arguments, the trainer's weighting into ``overall`` and the memory estimate's judge phase."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from easyrl.batch import Batch
from easyrl.config import load_config
from easyrl.rewards.judge import (
    DEFAULT_TEMPLATE,
    JudgePrompt,
    load_judge,
    load_parser,
    parse_json,
    parse_number,
    score_verdicts,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("verdict, score", [
    ("7", 7.0), ("I give it 3.5.", 3.5), ("Score: 7/10", 7.0), ("7 out of 10", 7.0), ("-1", -1.0),
    ("The answer 42 is right. Score: 1", 1.0), ("1e-1", 0.1), ("no idea", None), ("", None),
])
def test_parse_number_reads_the_last_number_without_a_denominator(verdict, score):
    assert parse_number(verdict) == score


@pytest.mark.parametrize("verdict, score", [
    ('{"score": 4}', 4.0), ('I think {"reason": "ok", "score": 0.5} overall', 0.5),
    ('{"score": 1} then {"score": 2}', 2.0), ('{"grade": 3}', None), ('{"score": "high"}', None),
    ('{"score": true}', None), ("score: 4", None), ('{"score": 4', None),
])
def test_parse_json_reads_the_key_of_the_last_object_holding_it(verdict, score):
    assert parse_json(verdict, "score") == score


def test_unparseable_verdicts_are_counted_and_given_the_configured_score():
    def picky(verdict):
        if verdict == "boom":
            raise RuntimeError("the parser failed")
        return {"1": 1, "inf": math.inf, "yes": True}.get(verdict)

    scores, unparseable = score_verdicts(["1", "boom", "inf", "yes", None, "x"], picky, -2.0)
    assert scores == [1.0, -2.0, -2.0, -2.0, -2.0, -2.0]
    assert unparseable == 5


def test_parser_from_a_file_and_by_name(tmp_path):
    (tmp_path / "p.py").write_text("def half(verdict):\n    return len(verdict) / 2\n")
    assert load_parser(f"{tmp_path / 'p.py'}:half")("abcd") == 2.0
    assert load_parser("number")("3") == 3.0
    assert load_parser("json", json_key="grade")('{"grade": 2}') == 2.0


def test_the_default_template_renders_problem_response_and_ground_truth():
    prompt = JudgePrompt(None)
    assert Path(prompt.path) == DEFAULT_TEMPLATE == REPO / "easyrl/rewards/judge.jinja"
    text = prompt.render("What is 2+2?", "  It is 5.  ", "4")
    assert "What is 2+2?" in text and "It is 5." in text and "Reference answer: 4" in text


def test_judge_config_is_off_by_default_and_loads_from_the_command_line():
    config = load_config(["worker.actor.model.model_path=m"])
    assert config.worker.reward.judge.model_path is None and load_judge(config.worker.reward.judge) is None
    config = load_config(["worker.actor.model.model_path=m", f"worker.reward.judge.model_path={REPO}",
                          "worker.reward.judge.parser=json", "worker.reward.judge.json_key=grade",
                          "worker.reward.judge.weight=0.25"])
    judge = load_judge(config.worker.reward.judge)
    assert judge.scores(['{"grade": 4}', "4"]) == ([4.0, 0.0], 1)
    inputs = [{"response": "r", "ground_truth": "g", "columns": {"prompt": "p"}}]
    assert "p" in judge.prompts(inputs)[0] and "Reference answer: g" in judge.prompts(inputs)[0]


def test_judge_engine_arguments_claim_a_share_on_accelerators_without_sleep_mode():
    from easyrl.workers.judge import judge_engine_arguments

    config = load_config(["worker.actor.model.model_path=m", "worker.reward.judge.model_path=judge",
                          "worker.reward.judge.max_model_len=512", "worker.reward.judge.gpu_memory_utilization=0.2"])
    judge = config.worker.reward.judge
    cpu = judge_engine_arguments(judge, "cpu", seed=3, enforce_eager=True)
    assert cpu["model"] == "judge" and cpu["max_model_len"] == 512 and cpu["seed"] == 3 and cpu["dtype"] == "auto"
    fp32 = load_config(["worker.actor.model.model_path=m", "worker.reward.judge.model_path=judge",
                        "worker.reward.judge.dtype=fp32"]).worker.reward.judge
    assert judge_engine_arguments(fp32, "cpu", seed=3, enforce_eager=True)["dtype"] == "float32"
    assert "gpu_memory_utilization" not in cpu
    gpu = judge_engine_arguments(judge, "cuda", seed=3, enforce_eager=False)
    assert gpu["gpu_memory_utilization"] == 0.2
    # no sleep mode: vLLM's sleep allocator is one per process, shared with the rollout engine (easyrl.workers.judge)
    assert "enable_sleep_mode" not in gpu


def test_judge_scores_are_weighted_into_overall_on_the_last_token():
    from tensordict import TensorDict

    from easyrl.trainer.scoring import add_model_scores

    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    scores = torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 1.0]])
    batch = Batch(TensorDict({"response_mask": mask, "token_level_scores": scores}, batch_size=[2]),
                  {"score/overall": [0.5, 1.0]})
    add_model_scores(batch, "judge", [2.0, -1.0], weight=0.5)
    assert batch["score/judge"] == [2.0, -1.0]
    assert batch["score/overall"] == [1.5, 0.5]
    assert torch.equal(batch["token_level_scores"], torch.tensor([[0.0, 1.5, 0.0], [0.0, 0.0, 0.5]]))


def test_memory_estimate_counts_the_resident_judge_engine_in_both_phases():
    from easyrl.errors import ConfigError
    from easyrl.sizing.estimate import check_memory, estimate_memory

    base = [f"config={REPO / 'config.yaml'}", "worker.actor.model.model_path=m"]
    plain = estimate_memory(7_000_000_000, 152_064, load_config(base), capacity_gib=80.0)
    config = load_config([*base, "worker.reward.judge.model_path=j", "worker.reward.judge.gpu_memory_utilization=0.2"])
    judged = estimate_memory(7_000_000_000, 152_064, config, capacity_gib=80.0)
    assert judged.rollout_gib == pytest.approx(plain.rollout_gib + 0.2 * 80)
    assert judged.training_gib == pytest.approx(plain.training_gib + 0.2 * 80)
    check_memory(judged)
    config.worker.reward.judge.gpu_memory_utilization = 0.5  # 0.6 (rollout) + 0.5 of the device, beside the actor
    with pytest.raises(ConfigError, match="worker.reward.judge.gpu_memory_utilization"):
        check_memory(estimate_memory(7_000_000_000, 152_064, config, capacity_gib=80.0))
