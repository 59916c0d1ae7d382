"""docs/errors.md, configuration entries (C..): each bad setting ends in one ``easyrl: config error: ...`` line naming
the key, with exit status 2 and no traceback, before anything is loaded (``load_config`` only; no model, data, Ray).

Each case runs ``load_config`` through the CLI's own error handler (``easyrl.errors.run_cli``); a few real
``python -m easyrl.trainer`` subprocesses are in ``tests/test_errors_cli.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from easyrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
DEMO = f"config={REPO / 'examples/configs/cpu_demo.yaml'}"
BASE = [DEMO, "worker.actor.model.model_path=m"]  # a valid configuration; each case adds one mistake

# (catalog id, overrides on top of BASE, strings the message must contain)
CASES = [
    ("C01", ["data.rollout_bach_size=4"], ["data.rollout_bach_size", "the command line", "data.rollout_batch_size"]),
    ("C02", ["worker.rollout.prompt_length=10"], ["worker.rollout.prompt_length", "data.max_prompt_length"]),
    ("C03", ["data.max_prompt_length=abc"], ["'data.max_prompt_length' (from the command line): got 'abc'",
                                             "write an integer, e.g. data.max_prompt_length=1024"]),
    ("C04", ["data.rollout_batch_size=0"], ["data.rollout_batch_size", "positive", "0"]),
    ("C05", ["worker.actor.global_batch_size=0"], ["worker.actor.global_batch_size", "positive"]),
    ("C06", ["worker.actor.micro_batch_size_per_device_for_update=0"],
     ["worker.actor.micro_batch_size_per_device_for_update", "positive"]),
    ("C07", ["trainer.n_gpus_per_node=0"], ["trainer.n_gpus_per_node", "positive"]),
    ("C08", ["trainer.nnodes=-1"], ["trainer.nnodes", "positive", "-1"]),
    ("C09", ["worker.rollout.n=0"], ["worker.rollout.n", "positive"]),
    ("C10", ["trainer.max_steps=0"], ["trainer.max_steps", "positive"]),
    ("C11", ["worker.actor.ppo_epochs=0"], ["worker.actor.ppo_epochs", "positive"]),
    ("C12", ["data.max_response_length=0"], ["data.max_response_length", "positive"]),
    ("C13", ["data.rollout_batch_size=3"], ["data.rollout_batch_size (3)", "worker.actor.global_batch_size (2)"]),
    ("C14", ["trainer.n_gpus_per_node=3"], ["worker.actor.global_batch_size * worker.rollout.n (8)", "3 devices"]),
    ("C15", ["worker.actor.micro_batch_size_per_device_for_update=3"],
     ["worker.actor.micro_batch_size_per_device_for_update (3)", "4 samples per device"]),
    ("C16", ["worker.rollout.top_p=1.5"], ["worker.rollout.top_p", "(0, 1]", "1.5"]),
    ("C17", ["worker.rollout.temperature=-0.5"], ["worker.rollout.temperature", "-0.5"]),
    ("C18", ["data.min_pixels=20000"], ["data.min_pixels (20000)", "data.max_pixels (12544)"]),
    ("C19", ["worker.rollout.val_override_config.temprature=0.5"],
     ["worker.rollout.val_override_config.temprature", "temperature"]),
    ("C20", ["worker.rollout.val_override_config.n=0"], ["worker.rollout.val_override_config.n", "positive"]),
    ("C21", ["algorithm.adv_estimator=grpoo"], ["algorithm.adv_estimator='grpoo' is not one of: grpo, rloo",
                                                "Did you mean: grpo?"]),
    ("C22", ["algorithm.use_kl_in_reward=true"], ["algorithm.use_kl_loss", "algorithm.use_kl_in_reward"]),
    ("C23", ["worker.rollout.calculate_log_probs=false", "worker.actor.tis_cap=2.0"],
     ["worker.actor.tis_cap", "worker.rollout.calculate_log_probs"]),
    ("C24", ["worker.reward.reward_function_kwargs=3"], ["worker.reward.reward_function_kwargs", "mapping"]),
    ("C25", ["data.max_prompt_length=[1,"], ["data.max_prompt_length=[1,"]),
    ("C26", ["worker.actor.optim.lr_warmup_ratio=2"], ["worker.actor.optim.lr_warmup_ratio", "[0, 1]"]),
    ("C27", ["worker.rollout.gpu_memory_utilization=0"], ["worker.rollout.gpu_memory_utilization", "(0, 1]"]),
    ("C28", ["worker.actor.clip_ratio_dual=1.0"], ["worker.actor.clip_ratio_dual", "greater than 1"]),
    ("C29", ["trainer.val_freq=0"], ["trainer.val_freq", "-1"]),
    ("C30", ["worker.actor.model.model_path=null"], ["worker.actor.model.model_path", "not set"]),
    ("C31", ["worker.rollout.n"], ["'worker.rollout.n'", "key=value", "--help"]),
    ("C32", ["config=nope.yaml"], ["nope.yaml", "does not exist", "write config=<path of an existing YAML file>",
                                   "config=config.yaml"]),
    ("C33", ["worker.actor.optim.betas=[0.9,1.5]"], ["worker.actor.optim.betas[1]", "[0, 1)"]),
    ("C50", ["worker.actor.model.lora.rank=-4"], ["worker.actor.model.lora.rank", "0 or more", "-4"]),
    ("C51", ["worker.actor.model.lora.rank=8", "worker.actor.model.lora.alpha=0"],
     ["worker.actor.model.lora.alpha", "positive"]),
    ("C52", ["worker.actor.model.lora.rank=8", "worker.actor.model.lora.target_modules=' , '"],
     ["worker.actor.model.lora.target_modules", "all-linear"]),
    ("C53", ["worker.actor.model.lora.rank=8", "worker.actor.model.lora.exclude_modules='.*visual(.*'"],
     ["worker.actor.model.lora.exclude_modules", ".*visual(.*", "regular expression"]),
    ("C39", ["trainer.logger=[console,neptune]"], ["trainer.logger", "'neptune'", "swanlab, mlflow"]),
    ("C54", ["worker.env_vars={1BAD: x}"], ["worker.env_vars", "'1BAD'", "environment variable name"]),
    ("C55", ["worker.rollout.tensor_parallel_size=3"],
     ["worker.rollout.tensor_parallel_size=3", "2 devices", "choose one of 1, 2"]),
    ("C56", ["worker.rollout.tensor_parallel_size=0"], ["worker.rollout.tensor_parallel_size", "positive", "0"]),
    ("C60", ["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=3"],
     ["data.rollout_batch_size (4)", "worker.critic.global_batch_size (3)"]),
    ("C61", ["trainer.critic_warmup=2"], ["trainer.critic_warmup=2", "algorithm.adv_estimator=gae"]),
    ("C62", ["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=2", "worker.critic.model.lora.rank=8"],
     ["worker.critic.model.lora.rank", "worker.actor.model.lora"]),
    ("C95", ["algorithm.kl_type=fixd"], ["algorithm.kl_type='fixd' is not one of: fixed, adaptive.", "Did you mean: fixed?"]),
    ("C96", ["worker.actor.entropy_coeff=.nan"], ["worker.actor.entropy_coeff must be a finite number, got nan."]),
    ("C99", ["worker.reward.timeout_s=0"], ["worker.reward.timeout_s must be a positive number (or null), got 0."]),
]


@pytest.mark.parametrize("overrides, culprits", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_config_error(expect_user_error, overrides, culprits):
    argv = [word for word in BASE if not word.startswith("config=")] if overrides[0].startswith("config=") else BASE
    expect_user_error(lambda: load_config(argv + overrides), "config", *culprits)


# (catalog id, YAML text, strings the message must contain; "{path}" is the file's path)
YAML_CASES = [
    ("C34", "worker:\n  rollout:\n    tempreature: 0.5\n", ["worker.rollout.tempreature", "{path}",
                                                           "worker.rollout.temperature"]),
    ("C35", "data:\n  max_prompt_length: [1, 2\n", ["{path}", "not valid YAML", "line 3", "starts at line 2",
                                                    "close the '[' opened on line 2 with ']'"]),
    ("C36", "- data\n- worker\n", ["{path}", "list at the top level", "mapping"]),
    ("C37", "data:\n\tmax_prompt_length: 1\n", ["{path}", "not valid YAML", "line 2", "indents with spaces, not tabs",
                                               "replace the tab(s) at the start of line(s) 2 with spaces"]),
    ("C38", "worker: 3\n", ["'worker'", "{path}", "section"]),
]


@pytest.mark.parametrize("text, culprits", [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES])
def test_yaml_error(expect_user_error, tmp_path, text, culprits):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    culprits = [c.replace("{path}", str(path)) for c in culprits]
    expect_user_error(lambda: load_config([f"config={path}", "worker.actor.model.model_path=m"]), "config", *culprits)


def test_valid_base_config_loads():
    """The base of the cases above is valid, so each case fails for its own mistake only."""
    config = load_config(BASE)
    assert config.data.rollout_batch_size == 4 and config.worker.rollout.n == 4 and config.world_size == 2


def test_tensor_parallel_size_that_cannot_split_the_heads(expect_user_error):  # C57
    """Checked before Ray (``easyrl.trainer.preflight.prepare``) against the model's config, instead of by vLLM on every
    worker after the model has loaded: 4 devices, TP 4, a model with 6 attention heads."""
    from transformers import Qwen2Config

    from easyrl.trainer.preflight import check_rollout_split

    hf_config = Qwen2Config(num_attention_heads=6, num_key_value_heads=2, hidden_size=384)
    expect_user_error(lambda: check_rollout_split(hf_config, 4), "config", "worker.rollout.tensor_parallel_size=4",
                      "num_attention_heads=6", "divide it")


def test_ulysses_size_that_does_not_divide_the_devices(expect_user_error):  # C92
    """worker.actor.ulysses_size (EasyR1's key) must divide the devices (easyrl/config/checks.py)."""
    expect_user_error(lambda: load_config([DEMO, "worker.actor.model.model_path=m", "worker.actor.ulysses_size=8",
                                           "trainer.n_gpus_per_node=2"]),
                      "config", "worker.actor.ulysses_size=8", "must divide the 2 devices")


def test_mini_rollout_batch_size_that_cannot_split(expect_user_error):  # C93
    words = [DEMO, "worker.actor.model.model_path=m", "data.mini_rollout_batch_size=3", "trainer.n_gpus_per_node=8",
             "worker.actor.micro_batch_size_per_device_for_update=1"]
    expect_user_error(lambda: load_config(words),
                      "config", "data.mini_rollout_batch_size * worker.rollout.n (12)", "8 devices")


def test_override_chat_template_missing(expect_user_error, tmp_path):  # C94
    from easyrl.trainer.model_checks import override_chat_template

    expect_user_error(lambda: override_chat_template(object(), None, str(tmp_path / "chat.jinja")), "config",
                      "data.override_chat_template=", "chat.jinja", "cannot be read")
