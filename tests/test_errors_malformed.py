"""docs/errors.md, configuration entries C70..: every way a command-line word, a YAML file, a section or a value can
be malformed, duplicated or empty, and the value checks of issue #27 (unresolved ``${...}``, greedy sampling with
groups, run names that leave the runs root). Each ends in one ``easyrl: config error: ...`` line naming the culprit
and what to write instead, exit status 2, no traceback (``expect_user_error``: the CLI's own handler)."""

from __future__ import annotations

from pathlib import Path

import pytest

from easyrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
MODEL = "worker.actor.model.model_path=m"
BASE = [f"config={REPO / 'examples/configs/cpu_demo.yaml'}", MODEL]

# (catalog id, words after BASE, strings the message must contain)
WORD_CASES = [
    ("C72", ["data.max_prompt_length=${data.max_response_length}",
             "data.max_response_length=${data.max_prompt_length}"],
     ["'data.max_prompt_length' = '${data.max_response_length}'", "refers back to itself", "write a value"]),
    ("C76", [f"config={REPO / 'examples/configs/smollm2_learn.yaml'}"],
     ["config= is given 2 times", "cpu_demo.yaml", "smollm2_learn.yaml", "merge them into one"]),
    ("C79", ["=5"], ["'=5'", "no key before '='", "key=value"]),
    ("C80", ["data.max_prompt_length="], ["'data.max_prompt_length'", "has no value", "write an integer",
                                          "data.max_prompt_length=1024"]),
    ("C82", ["data.max_prompt_length=[1,2]"], ["'data.max_prompt_length'", "[1, 2]", "write an integer"]),
    ("C83", ["data.max_prompt_length={a: 1}"], ["'data.max_prompt_length'", "holds one value, not a section",
                                                "{'a': 1}", "write an integer"]),
    ("C84", ["trainer.logger=console"], ["'trainer.logger'", "write a list", "trainer.logger=[console,jsonl]"]),
    ("C85", ["worker.actor.optim.betas=[0.9]"], ["'worker.actor.optim.betas'", "length 1",
                                                 "worker.actor.optim.betas=[0.9,0.999]"]),
    ("C87", ["worker.rollout.temperature=0"], ["worker.rollout.temperature=0", "worker.rollout.n=4", "identical",
                                               "algorithm.adv_estimator=grpo", "worker.rollout.temperature=1.0"]),
    ("C88", ["trainer.experiment_name=../../etc"], ["trainer.experiment_name='../../etc'", "not one folder name",
                                                    "trainer.experiment_name=etc", "trainer.runs_root"]),
    ("C89", ["trainer.project_name=/tmp/x"], ["trainer.project_name='/tmp/x'", "'/tmp/x/cpu_demo'",
                                              "trainer.project_name=tmp_x"]),
    ("C90", ["trainer.experiment_name=''"], ["trainer.experiment_name is empty", "trainer.experiment_name=my_run"]),
    ("C91", ["worker.rollout=null"], ["'worker.rollout'", "empty section", "worker.rollout.<key>=value"]),
]


@pytest.mark.parametrize("words, culprits", [c[1:] for c in WORD_CASES], ids=[c[0] for c in WORD_CASES])
def test_malformed_word(expect_user_error, words, culprits):
    expect_user_error(lambda: load_config(BASE + words), "config", *culprits)


# (catalog id, YAML bytes, strings the message must contain; "{path}" is the file's path)
YAML_CASES = [
    ("C70", b"data:\n  max_prompt_length: ${data.max_promt_length}\n",
     ["'data.max_prompt_length' = '${data.max_promt_length}'", "names no config key", "${data.max_prompt_length}"]),
    ("C71", b"data:\n  max_prompt_length: ${oc.env:EASYRL_TEST_UNSET_27}\n",
     ["'data.max_prompt_length'", "EASYRL_TEST_UNSET_27 is not set", "${oc.env:EASYRL_TEST_UNSET_27,<default>}"]),
    ("C73", b"data:\n  max_prompt_length: ${data.max_response_length\n",
     ["{path}", "'data.max_prompt_length'", "malformed ${...}", "closing brace"]),
    ("C74", b"trainer:\n  experiment_name: caf\xe9\n", ["{path}", "not UTF-8", "byte 0xe9 at line 2, column 23",
                                                         "save the file as UTF-8"]),
    ("C75", b"data:\n  max_prompt_length: 10\n  max_prompt_length: 20\n",
     ["{path}", "line 3", "found duplicate key max_prompt_length"]),
    ("C81", b"worker:\ndata:\n  max_prompt_length: 10\n", ["'worker'", "{path}", "empty section",
                                                             "give its keys indented below it"]),
    ("C86", b"cpu_demo\n", ["{path}", "holds a str at the top level", "mapping of sections"]),
]


@pytest.mark.parametrize("text, culprits", [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES])
def test_malformed_yaml(expect_user_error, tmp_path, monkeypatch, text, culprits):
    monkeypatch.delenv("EASYRL_TEST_UNSET_27", raising=False)
    path = tmp_path / "bad.yaml"
    path.write_bytes(text)
    culprits = [c.replace("{path}", str(path)) for c in culprits]
    expect_user_error(lambda: load_config([f"config={path}", MODEL]), "config", *culprits)


def test_config_word_that_is_empty(expect_user_error):  # C77
    expect_user_error(lambda: load_config(["config=", MODEL]), "config", "config= is empty",
                      "config=examples/configs/cpu_demo.yaml")


def test_config_word_that_names_a_folder(expect_user_error):  # C78
    folder = str(REPO / "examples/configs")
    expect_user_error(lambda: load_config([f"config={folder}", MODEL]), "config", f"'{folder}'", "is a folder",
                      f"config={folder}/")


def test_interpolations_that_resolve_still_work_and_repeated_words_take_the_last(tmp_path):
    """Not errors: ``${...}`` of an existing key (OmegaConf's, as in EasyR1), and a key given twice on the command line
    (the later word wins: launch scripts append overrides)."""
    config = load_config(BASE + ["data.val_batch_size=${data.rollout_batch_size}", "data.max_prompt_length=100",
                                 "data.max_prompt_length=200"])
    assert config.data.val_batch_size == config.data.rollout_batch_size == 4
    assert config.data.max_prompt_length == 200


def test_greedy_sampling_without_groups_is_allowed():
    """``temperature=0`` is refused only where the advantage is relative to the group; ``n=1`` is fine."""
    assert load_config(BASE + ["worker.rollout.temperature=0", "worker.rollout.n=1", "worker.actor.global_batch_size=2",
                               "worker.actor.micro_batch_size_per_device_for_update=1"]).worker.rollout.n == 1


def test_greedy_sampling_with_n_copies_warns_where_it_still_learns():  # W10
    """Without a group baseline (gae, reinforce_plus_plus) greedy ``n > 1`` trains, on copies: a warning."""
    from easyrl.config.checks import ConfigWarning

    with pytest.warns(ConfigWarning) as caught:
        load_config(BASE + ["worker.rollout.temperature=0", "algorithm.adv_estimator=reinforce_plus_plus"])
    line = next(str(w.message) for w in caught if "samples greedily" in str(w.message))
    for culprit in ("worker.rollout.temperature=0.0", "worker.rollout.n=4", "reinforce_plus_plus", "1/4",
                    "worker.rollout.n=1"):
        assert culprit in line, line
