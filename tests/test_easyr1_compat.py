"""EasyR1's configs load unchanged: its examples/config.yaml and launch scripts' overrides (tests/data/easyr1/), each
EasyR1 key either easyrl's own or mapped at load with one log line (easyrl/config/aliases.py); docs/migrating.md."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

import pytest

from easyrl.config import ConfigError, load_config
from easyrl.config.aliases import apply_aliases

REPO = Path(__file__).resolve().parents[1]
EASYR1 = REPO / "tests" / "data" / "easyr1"
CONFIG = f"config={EASYR1 / 'config.yaml'}"


@pytest.fixture(autouse=True)
def dashboards_installed(monkeypatch):
    """EasyR1's configs name wandb and swanlab, whose libraries need not be installed for a load test."""
    import easyrl.config.trainer as trainer_config

    for name in ("wandb", "swanlab"):
        monkeypatch.setitem(trainer_config.BACKENDS, name, (None, None))


def script(name: str) -> list[str]:
    """The command-line words one EasyR1 launch script passes after ``config=examples/config.yaml``."""
    lines = (EASYR1 / f"{name}.args").read_text().splitlines()
    return [CONFIG] + [word for line in lines if line.strip() for word in shlex.split(line)]


def test_easyr1_config_yaml_loads_with_its_values(caplog):
    with caplog.at_level(logging.INFO, logger="easyrl.config"):
        config = load_config([CONFIG])
    data, algo, actor, ref, rollout, trainer = (config.data, config.algorithm, config.worker.actor, config.worker.ref,
                                                config.worker.rollout, config.trainer)
    assert (data.max_prompt_length, data.rollout_batch_size, data.val_batch_size) == (2048, 512, 1024)
    assert data.mini_rollout_batch_size is None and data.generation_batch_size == 512
    assert (data.video_key, data.video_fps, data.override_chat_template) == ("videos", 2.0, None)
    assert (algo.use_kl_loss, algo.kl_penalty, algo.kl_coef) == (True, "low_var_kl", 1e-2)
    assert algo.max_try_make_batch == 20  # trainer.max_try_make_batch
    assert (actor.global_batch_size, actor.micro_batch_size_per_device_for_update,
            actor.micro_batch_size_per_device_for_experience) == (128, 1, 2)
    assert actor.fsdp.enable_gradient_checkpointing  # worker.actor.model.enable_gradient_checkpointing
    assert actor.fsdp.reshard_after_forward  # worker.actor.fsdp.enable_full_shard
    assert actor.offload.offload_params and actor.offload.offload_optimizer
    assert ref.offload.offload_params  # worker.ref.fsdp.enable_cpu_offload: true beside offload_params: false
    assert (actor.optim.strategy, actor.optim.lr_scheduler_type, actor.optim.lr_warmup_steps) == ("adamw", "constant",
                                                                                                   None)
    assert (rollout.n, rollout.tensor_parallel_size, rollout.limit_images) == (5, 2, 0)
    assert rollout.val_override_config == {"temperature": 0.6, "top_p": 0.95, "n": 1}
    assert trainer.logger == ["jsonl", "wandb"]  # EasyR1's file logger
    assert (trainer.save_limit, trainer.save_model_only, trainer.val_generations_to_log) == (3, False, 3)
    assert config.worker.reward.reward_function.endswith("examples/reward_function/math.py:compute_score")
    lines = [r.getMessage() for r in caplog.records if r.name == "easyrl.config"]
    assert any("trainer.max_try_make_batch=20" in line and "algorithm.max_try_make_batch=20" in line for line in lines)
    assert any("logger 'file'" in line and "jsonl" in line for line in lines)
    assert any("worker.ref.fsdp.enable_cpu_offload=True" in line and "worker.ref.offload.offload_params=True" in line
               for line in lines)


def test_dapo_script():
    config = load_config(script("qwen2_5_vl_7b_geo3k_dapo"))
    assert config.data.mini_rollout_batch_size == 128 and config.data.generation_batch_size == 128
    assert config.algorithm.online_filtering and config.algorithm.disable_kl
    assert (config.worker.actor.clip_ratio_low, config.worker.actor.clip_ratio_high) == (0.2, 0.28)
    assert config.data.train_files == "hiyouga/geometry3k@train"


def test_gspo_script():
    actor = load_config(script("qwen2_5_vl_7b_geo3k_gspo")).worker.actor
    assert actor.loss_type == "gspo_token"
    assert actor.loss_agg_mode == "seq-mean-token-mean"  # worker.actor.loss_avg_mode=seq
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (3e-4, 4e-4)


def test_32b_script_bf16_weights_and_moments():
    config = load_config(script("qwen2_5_vl_32b_geo3k_grpo"))
    assert config.worker.actor.fsdp.torch_dtype == "bf16"
    assert config.worker.actor.optim.strategy == "adamw_bf16"
    assert config.worker.rollout.tensor_parallel_size == 8


def test_android_gui_script():
    config = load_config(script("qwen2_5_vl_3b_android_gui_grpo"))
    optim = config.worker.actor.optim
    assert (optim.lr, optim.weight_decay, optim.lr_warmup_ratio, optim.lr_scheduler_type) == (1e-5, 0.1, 0.05,
                                                                                              "constant")
    assert config.trainer.logger == ["console", "wandb"]
    assert (config.data.rollout_batch_size, config.data.max_response_length, config.worker.rollout.n) == (32, 64, 8)
    assert config.data.filter_overlong_prompts is False and config.worker.actor.model.trust_remote_code


def test_reinforce_swanlab_lora_cispo_scripts():
    algo = load_config(script("qwen2_5_vl_7b_geo3k_reinforce")).algorithm
    assert (algo.adv_estimator, algo.use_kl_loss, algo.kl_penalty, algo.kl_coef) == ("reinforce_plus_plus", False,
                                                                                     "kl", 1e-3)
    assert load_config(script("qwen2_5_vl_7b_geo3k_swanlab")).trainer.logger == ["console", "swanlab"]
    lora = load_config(script("qwen3_4b_math_grpo_lora"))
    assert (lora.worker.actor.model.lora.rank, lora.worker.actor.optim.lr, lora.world_size) == (64, 1e-5, 1)
    actor = load_config(script("qwen2_5_vl_7b_geo3k_cispo")).worker.actor
    assert (actor.loss_type, actor.clip_ratio_low, actor.clip_ratio_high) == ("cispo", 0, 4)


def test_ulysses_script_loads_unchanged():
    config = load_config(script("qwen3_14b_dapo17k_dapo"))
    actor, algo = config.worker.actor, config.algorithm
    assert (actor.ulysses_size, config.world_size, config.dp_size) == (8, 8, 1)
    assert (actor.optim.lr_warmup_steps, actor.fsdp.torch_dtype, actor.optim.strategy) == (10, "bf16", "adamw_bf16")
    assert (algo.max_try_make_batch, algo.filter_key) == (10, "accuracy_normalized")
    assert config.data.mini_rollout_batch_size == 256
    assert config.worker.rollout.val_override_config == {"n": 16, "temperature": 1.0, "top_p": 0.7}
    assert config.worker.reward.reward_function_kwargs["overlong_buffer_length"] == 4096


def test_alias_values_and_refusals():
    tree = {"worker": {"actor": {"loss_type": "default", "fsdp": {"enable_cpu_offload": True},
                                 "offload": {"offload_params": False}},
                       "ref": {"fsdp": {"enable_rank0_init": True}}}}
    mapped = apply_aliases(tree, "test")
    assert mapped["worker"]["actor"]["loss_type"] == "vanilla"
    assert mapped["worker"]["actor"]["offload"]["offload_params"] is True  # FSDP CPU offload = parameters on host
    assert "fsdp" not in mapped["worker"]["actor"] and "ref" not in mapped["worker"]  # emptied sections go
    assert tree["worker"]["actor"]["loss_type"] == "default"  # the layer itself is not changed
    for key, value in [("fsdp_size", 4), ("ulysses_size", 2)]:
        layer = {"worker": {"critic": {key: value}}} if key == "ulysses_size" else \
            {"worker": {"actor": {"fsdp": {key: value}}}}
        with pytest.raises(ConfigError, match=key):
            apply_aliases(layer, "test")
    verl = apply_aliases({"worker": {"actor": {"ulysses_sequence_parallel_size": 4}}}, "test")
    assert verl["worker"]["actor"] == {"ulysses_size": 4}
    with pytest.raises(ConfigError, match="only vllm"):
        apply_aliases({"worker": {"rollout": {"name": "sglang"}}}, "the command line")


def test_mini_rollout_batch_size_must_split_over_devices():
    with pytest.raises(ConfigError, match="mini_rollout_batch_size"):
        load_config([CONFIG, "data.mini_rollout_batch_size=3"])  # 3 * 5 samples over 8 devices
