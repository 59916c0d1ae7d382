"""Configuration: defaults <- YAML <- CLI, auto keys, and errors that name the key before any work starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from easyrl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
DEMO = f"config={REPO / 'examples/configs/cpu_demo.yaml'}"


def test_precedence_defaults_yaml_cli():
    config = load_config([DEMO, "worker.actor.model.model_path=m", "worker.rollout.n=8"])
    assert config.worker.rollout.n == 8  # CLI over YAML (4)
    assert config.data.max_prompt_length == 256  # YAML over default (1024)
    assert config.worker.actor.clip_ratio_dual == 3.0  # default
    # auto keys follow their sources
    assert config.worker.rollout.prompt_length == 256
    assert config.worker.rollout.response_length == config.data.max_response_length == 48
    assert config.worker.actor.kl_coef == config.algorithm.kl_coef


def test_every_auto_key_holds_its_source():
    """``PPOConfig.finalize`` copies each auto key from the source its field names (``auto("algorithm.kl_coef")``);
    every source is set away from the auto field's default here, so a key left uncopied fails."""
    from functools import reduce

    from easyrl.config import auto_keys

    config = load_config([DEMO, "worker.actor.model.model_path=m", "worker.actor.model.trust_remote_code=true",
                          "algorithm.use_kl_loss=false", "algorithm.kl_penalty=k2", "algorithm.kl_coef=0.3",
                          "algorithm.disable_kl=true", "worker.rollout.temperature=0.7", "data.min_pixels=1000",
                          "worker.actor.micro_batch_size_per_device_for_experience=3",
                          "worker.actor.fsdp.param_dtype=fp32"])
    autos = {key: source for key, source in auto_keys(type(config)).items() if "/" not in source}
    assert len(autos) == 13
    for key, source in autos.items():
        assert reduce(getattr, key.split("."), config) == reduce(getattr, source.split("."), config), key
    assert config.trainer.run_dir == "runs/easyrl/cpu_demo"


def test_typo_fails_fast_from_the_command_line():
    """A typo is reported before any heavy library is imported (no torch, Ray, vLLM or transformers start-up)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "easyrl.trainer", f"config={REPO / 'config.yaml'}",
         "data.max_promt_length=1024"],
        check=False, capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 2
    assert "data.max_promt_length" in proc.stderr and "data.max_prompt_length" in proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "easyrl.config" in imported  # the import-time log was read
    assert not imported & {"torch", "ray", "vllm", "transformers"}


def test_typo_in_yaml_names_file_and_suggestion(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("worker:\n  rollout:\n    tempreature: 0.5\n")
    with pytest.raises(ConfigError, match=r"worker\.rollout\.tempreature.*bad\.yaml.*worker\.rollout\.temperature"):
        load_config([f"config={bad}", "worker.actor.model.model_path=m"])


def test_auto_key_cannot_be_set():
    with pytest.raises(ConfigError, match=r"worker\.rollout\.prompt_length.*data\.max_prompt_length"):
        load_config(["worker.actor.model.model_path=m", "worker.rollout.prompt_length=10"])


@pytest.mark.parametrize("override, message", [
    ("data.max_prompt_length=abc", r"data\.max_prompt_length"),
    ("algorithm.adv_estimator=grpoo", r"algorithm\.adv_estimator.*grpo"),
    ("worker.actor.loss_type=ppo2", r"worker\.actor\.loss_type.*vanilla"),
    ("worker.actor.loss_agg_mode=mean", r"worker\.actor\.loss_agg_mode.*token-mean"),
    ("algorithm.kl_penalty=k9", r"algorithm\.kl_penalty.*low_var_kl"),
    ("algorithm.kl_type=adaptve", r"algorithm\.kl_type"),
    ("worker.actor.fsdp.param_dtype=fp8", r"worker\.actor\.fsdp\.param_dtype"),
    ("trainer.logger=[console,neptune]", r"trainer\.logger.*neptune"),
    ("worker.reward.reward_type=parallel", r"worker\.reward\.reward_type"),
    ("trainer.device=tpu", r"trainer\.device"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config([DEMO, "worker.actor.model.model_path=m", override])


def test_batch_sizes_must_divide():
    with pytest.raises(ConfigError, match=r"rollout_batch_size"):
        load_config([DEMO, "worker.actor.model.model_path=m", "data.rollout_batch_size=3"])
    with pytest.raises(ConfigError, match=r"micro_batch_size_per_device_for_update"):
        load_config([DEMO, "worker.actor.model.model_path=m", "worker.actor.micro_batch_size_per_device_for_update=3"])


def test_whole_dict_replaces_but_sub_key_merges():
    replaced = load_config([DEMO, "worker.actor.model.model_path=m", "worker.reward.reward_function_kwargs={}"])
    assert replaced.worker.reward.reward_function_kwargs == {}
    merged = load_config([DEMO, "worker.actor.model.model_path=m", "worker.reward.reward_function_kwargs.scale=2"])
    assert merged.worker.reward.reward_function_kwargs == {"format_weight": 0.1, "scale": 2}


def test_missing_yaml_and_malformed_word():
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_config(["config=nope.yaml"])
    with pytest.raises(ConfigError, match=r"'worker\.rollout\.n'.*key=value"):
        load_config(["worker.rollout.n"])


@pytest.mark.parametrize("overrides, on_policy", [
    ([], True),
    (["worker.actor.ppo_epochs=2"], False),
    (["worker.actor.global_batch_size=2"], False),
    (["worker.rollout.calculate_log_probs=true", "worker.actor.tis_cap=2.0"], False),
    (["algorithm.use_kl_loss=false", "algorithm.use_kl_in_reward=true"], False),
    (["algorithm.use_kl_loss=false", "algorithm.use_kl_in_reward=true", "algorithm.disable_kl=true"], True),
])
def test_on_policy_update_skips_old_log_probs_only_when_provable(overrides, on_policy):
    config = load_config(["worker.actor.model.model_path=x", "data.rollout_batch_size=4",
                          "worker.actor.global_batch_size=4", "worker.rollout.n=2", "trainer.n_gpus_per_node=2",
                          "worker.actor.micro_batch_size_per_device_for_update=1", *overrides])
    assert config.on_policy_update is on_policy


def test_token_budget_must_hold_the_longest_sample():
    base = ["worker.actor.model.model_path=x", "data.max_prompt_length=100", "data.max_response_length=50"]
    with pytest.raises(ConfigError, match="max_token_len_per_device=149 is below the longest sample"):
        load_config([*base, "worker.actor.max_token_len_per_device=149"])
    config = load_config([*base, "worker.actor.max_token_len_per_device=150"])
    assert config.worker.actor.max_token_len_per_device == 150


def test_default_checkpoint_limit_keeps_three_and_the_best():
    """#20: the default run keeps the newest 3 checkpoints plus the best (EasyR1's example config), not every ~100 GB
    checkpoint; config.yaml says the same."""
    from easyrl.config import PPOConfig
    from easyrl.trainer.checkpoint import checkpoints_to_delete

    config = load_config([f"config={REPO / 'config.yaml'}", "worker.actor.model.model_path=m"])
    assert PPOConfig().trainer.save_limit == config.trainer.save_limit == 3
    assert checkpoints_to_delete([5, 10, 15, 20, 25], 25, config.trainer.save_limit, best=5) == [10]


def test_help_path_does_not_import_pydantic():
    """The fields' ranges are plain ``annotated_types`` markers: pydantic (~0.5 s with the adapter) is imported by the
    first ``load_config``, never by ``python -m easyrl.trainer --help``."""
    code = "import sys, easyrl.trainer.__main__; print('pydantic' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert proc.stdout.strip() == "False"
