"""Relative paths in a config file resolve against the file's folder (then the current folder, then the file's
parent folders), so a recipe runs from any folder (``easyrl.config.loading``, docs/config.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from easyrl.config import load_config
from easyrl.config.fields import input_path_keys, valid_keys
from easyrl.config.ppo import PPOConfig

REPO = Path(__file__).resolve().parents[1]


def test_an_example_recipe_finds_its_files_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config([f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m"])
    assert Path(config.data.train_files) == REPO / "examples/data/geometry3k_sample"
    assert Path(config.data.format_prompt) == REPO / "examples/format_prompt/math.jinja"
    reward_file, function = config.worker.reward.reward_function.rsplit(":", 1)
    assert Path(reward_file) == REPO / "examples/reward_function/math.py" and function == "compute_score"
    assert config.worker.actor.model.model_path == "m"  # a command-line path stays as written (current folder)
    assert config.trainer.runs_root == "runs"  # outputs stay relative to the current folder


def test_the_config_folder_wins_and_hub_ids_stay(tmp_path, monkeypatch):
    recipe, elsewhere = tmp_path / "recipe", tmp_path / "elsewhere"
    for folder in (recipe, elsewhere):
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "train.jsonl").write_text("{}\n")
    (recipe / "reward.py").write_text("def score(x):\n    return {}\n")
    (recipe / "run.yaml").write_text(
        "data:\n  train_files: data/train.jsonl\n  val_files: hiyouga/geometry3k@test\n"
        "worker:\n  actor:\n    model:\n      model_path: Qwen/Qwen2.5-0.5B-Instruct\n"
        "  reward:\n    reward_function: reward.py:score\n"
    )
    monkeypatch.chdir(elsewhere)
    config = load_config([f"config={recipe / 'run.yaml'}"])
    assert config.data.train_files == str(recipe / "data/train.jsonl")
    assert config.worker.reward.reward_function == f"{recipe / 'reward.py'}:score"
    assert config.data.val_files == "hiyouga/geometry3k@test"
    assert config.worker.actor.model.model_path == "Qwen/Qwen2.5-0.5B-Instruct"


def test_multi_turn_tool_parser_and_environment_files_resolve_next_to_the_config(tmp_path, monkeypatch):
    recipe, elsewhere = tmp_path / "recipe", tmp_path / "elsewhere"
    (recipe / "agents").mkdir(parents=True)
    elsewhere.mkdir()
    for name in ("tools.py", "parse.py", "env.py"):
        (recipe / "agents" / name).write_text("def f(x):\n    return x\n")
    (recipe / "run.yaml").write_text(
        "worker:\n  actor:\n    model:\n      model_path: m\n  rollout:\n    multi_turn:\n      enable: true\n"
        "      tools: [agents/tools.py:f]\n      format: agents/parse.py:f\n      environment: agents/env.py:f\n"
    )
    monkeypatch.chdir(elsewhere)
    multi_turn = load_config([f"config={recipe / 'run.yaml'}"]).worker.rollout.multi_turn
    assert multi_turn.tools == [f"{recipe / 'agents/tools.py'}:f"]
    assert multi_turn.format == f"{recipe / 'agents/parse.py'}:f"
    assert multi_turn.environment == f"{recipe / 'agents/env.py'}:f"


@pytest.mark.filterwarnings("ignore:worker.teacher.model.model_path is set")
def test_every_role_s_relative_model_and_tokenizer_paths_resolve_next_to_the_config(tmp_path, monkeypatch):
    recipe, elsewhere = tmp_path / "recipe", tmp_path / "elsewhere"
    elsewhere.mkdir()
    roles = {"worker.actor.model": "student", "worker.critic.model": "critic", "worker.teacher.model": "teacher",
             "worker.reward.reward_model": "rm"}
    for folder in roles.values():
        (recipe / "models" / folder).mkdir(parents=True)
    (recipe / "models" / "judge").mkdir()
    (recipe / "chat.jinja").write_text("{{ messages }}")
    lines = [f"{key}.model_path=models/{folder}" for key, folder in roles.items()]
    lines += [f"{key}.tokenizer_path=models/{folder}" for key, folder in roles.items()]
    lines += ["worker.reward.judge.model_path=models/judge", "data.override_chat_template=chat.jinja"]
    (recipe / "run.yaml").write_text("\n".join(_nested(lines)))
    monkeypatch.chdir(elsewhere)
    config = load_config([f"config={recipe / 'run.yaml'}"])
    for key, folder in roles.items():
        section = config
        for part in key.split("."):
            section = getattr(section, part)
        assert (section.model_path, section.tokenizer_path) == (str(recipe / "models" / folder),) * 2, key
    assert config.worker.reward.judge.model_path == str(recipe / "models/judge")
    assert config.data.override_chat_template == str(recipe / "chat.jinja")


def _nested(words: list[str]) -> list[str]:
    """``a.b.c=v`` words as the lines of a YAML file."""
    tree: dict = {}
    for word in words:
        key, value = word.split("=", 1)
        *sections, last = key.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = value
    return yaml.safe_dump(tree).splitlines()


def test_every_model_and_tokenizer_key_is_an_input_path():
    """A new role's checkpoint is resolved like every other: its ``*model_path``/``*tokenizer_path`` field must be
    marked ``input_path``."""
    keys = [key for key in valid_keys(PPOConfig) if key.endswith(("model_path", "tokenizer_path"))]
    outputs = {"trainer.save_model_path"}  # written, not read
    assert len(keys) >= 10  # actor, critic, teacher, reward model (two each), judge, save_model_path
    assert [key for key in keys if key not in outputs and key not in input_path_keys(PPOConfig)] == []
