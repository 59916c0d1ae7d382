"""The single-digit addition task of ``make demo-learn``: its generator, the shipped splits, and its reward."""

from __future__ import annotations

import importlib.util
import json
import random
import re
from pathlib import Path

import pytest

from easyrl.rewards.function import RewardFunction

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "data_preprocess" / "digit_addition.py"
SHIPPED = REPO / "examples" / "data" / "digit_addition"
REWARD = f"{REPO / 'examples' / 'reward_function' / 'last_number.py'}:compute_score"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("digit_addition_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_shipped_splits_are_what_the_generator_writes(generator, tmp_path):
    generator.main(["--output", str(tmp_path)])
    for split in ("train", "val"):
        assert (tmp_path / f"{split}.jsonl").read_text() == (SHIPPED / f"{split}.jsonl").read_text(), split


def test_rows_are_right_and_validation_is_held_out():
    train, val = read(SHIPPED / "train.jsonl"), read(SHIPPED / "val.jsonl")
    assert (len(train), len(val)) == (80, 20)

    def operands(row):
        match = re.fullmatch(r"What is (\d) \+ (\d)\? Reply with only the number\.", row["problem"])
        return int(match[1]), int(match[2])

    for row in train + val:
        a, b = operands(row)
        assert row["answer"] == str(a + b), row
    assert len({operands(r) for r in train + val}) == 100  # every ordered pair once
    # held out by unordered pair: neither a + b nor b + a of a validation problem is trained on
    assert not {frozenset(operands(r)) for r in val} & {frozenset(operands(r)) for r in train}


def test_split_refuses_a_bad_size(generator):
    with pytest.raises(ValueError, match="--val-pairs must be in 1..54"):
        generator.split_pairs(55, random.Random(0))


def test_reward_grades_the_last_integer():
    reward = RewardFunction(REWARD)
    inputs = [
        {"response": "7", "ground_truth": "7"},
        {"response": "3 + 4 = 7", "ground_truth": "7"},
        {"response": "7, because 3 + 4", "ground_truth": "7"},  # the last integer is 4
        {"response": "It is seven.", "ground_truth": "7"},  # no answer at all
        {"response": "-3", "ground_truth": "-3"},
        {"response": "17", "ground_truth": "7"},
    ]
    scores = reward(inputs)
    assert scores["accuracy"] == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert scores["overall"] == scores["accuracy"]
    assert scores["answered"] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]


def test_reward_names_a_bad_ground_truth():
    with pytest.raises(ValueError, match="reward input 1: ground_truth 'x' is not an integer"):
        RewardFunction(REWARD)([{"response": "1", "ground_truth": "1"}, {"response": "1", "ground_truth": "x"}])
