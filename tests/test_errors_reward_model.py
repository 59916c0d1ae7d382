"""docs/errors.md, reward-model entries (R30..): a bad ``worker.reward.reward_model`` ends in one ``easyrl: <kind>
error: ...`` line naming the key, before Ray starts (``load_config``, then the pre-flight's
``check_reward_model``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from easyrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
BASE = [f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m",
        "worker.reward.reward_model.model_path=rm"]

CASES = [
    ("R30", ["worker.reward.reward_model.micro_batch_size_per_device=0"],
     ["worker.reward.reward_model.micro_batch_size_per_device", "positive", "0"]),
    ("R31", ["algorithm.adv_estimator=remax"], ["worker.reward.reward_model.model_path", "remax"]),
    ("R32", ["worker.reward.reward_model.chat_template=' '"], ["worker.reward.reward_model.chat_template", "empty"]),
    ("R33", ["worker.reward.reward_model.max_length=-3"], ["worker.reward.reward_model.max_length", "-3"]),
    ("R40", ["worker.reward.reward_model.chat_template=templates/rm.jinja"],
     ["worker.reward.reward_model.chat_template", "templates/rm.jinja", "does not exist"]),
]


@pytest.mark.parametrize("cid,overrides,culprits", CASES, ids=[c[0] for c in CASES])
def test_bad_reward_model_setting(expect_user_error, cid, overrides, culprits):
    expect_user_error(lambda: load_config(BASE + overrides), "config", *culprits)


def _preflight(tmp_path: Path, rm_path: str, *overrides: str):
    from easyrl.trainer.reward_checks import check_reward_model

    config = load_config(BASE[:2] + [f"worker.reward.reward_model.model_path={rm_path}", *overrides])
    return lambda: check_reward_model(config.worker.reward.reward_model)


def test_reward_model_folder_missing(expect_user_error, tmp_path):  # R34
    expect_user_error(_preflight(tmp_path, str(tmp_path / "nope")), "model",
                      "worker.reward.reward_model.model_path", "does not exist")


def _folder(tmp_path: Path, num_labels: int, template: bool) -> str:
    from transformers import Qwen2Config

    from easyrl.testing.tiny_reward_model import RM_CHAT_TEMPLATE
    from easyrl.testing.tokenizer import build_qwen_tokenizer

    folder = tmp_path / "rm"
    Qwen2Config(num_labels=num_labels, num_hidden_layers=1, hidden_size=64, num_attention_heads=2,
                intermediate_size=64).save_pretrained(folder)
    build_qwen_tokenizer(RM_CHAT_TEMPLATE if template else None).save_pretrained(folder)
    return str(folder)


def test_reward_model_with_more_than_one_label(expect_user_error, tmp_path):  # R35
    expect_user_error(_preflight(tmp_path, _folder(tmp_path, 2, True)), "model",
                      "worker.reward.reward_model.model_path", "num_labels=2")


def test_reward_model_tokenizer_without_a_chat_template(expect_user_error, tmp_path):  # R36
    expect_user_error(_preflight(tmp_path, _folder(tmp_path, 1, False)), "model",
                      "worker.reward.reward_model.model_path", "no chat template",
                      "worker.reward.reward_model.chat_template")


def test_reward_model_chat_template_that_does_not_render(expect_user_error, tmp_path):  # R37
    expect_user_error(_preflight(tmp_path, _folder(tmp_path, 1, True),
                                 "worker.reward.reward_model.chat_template='{% for m in messages %}'"),
                      "config", "worker.reward.reward_model.chat_template", "TemplateSyntaxError")


def test_a_good_reward_model_passes_the_preflight(tmp_path):
    _preflight(tmp_path, _folder(tmp_path, 1, True))()
