"""Pre-flight memory estimate (easyrl.sizing.estimate) against a hand count."""

from __future__ import annotations

from pathlib import Path

import pytest

from easyrl.config import load_config
from easyrl.errors import ConfigError
from easyrl.sizing.anatomy import GIB, ModelShape, model_anatomy, model_shape
from easyrl.sizing.estimate import check_memory, estimate_memory

DEFAULT = f"config={Path(__file__).resolve().parents[1] / 'config.yaml'}"


def _config(*overrides):
    return load_config([DEFAULT, "worker.actor.model.model_path=m", *overrides])


def test_seven_billion_on_eight_80gb_gpus_by_hand():
    # config.yaml: 8 GPUs, actor not offloaded, reference offloaded, bf16 compute and rollout, micro-batch 4,
    # responses of 2048 tokens, gpu_memory_utilization 0.6
    config = _config("data.max_response_length=2048", "worker.actor.micro_batch_size_per_device_for_update=4")
    assert config.world_size == 8 and config.worker.ref.offload.offload_params
    e = estimate_memory(7_000_000_000, 152_064, config, capacity_gib=80.0)
    shard = 7e9 / 8
    assert e.vllm_weights_gib == pytest.approx(2 * 7e9 / GIB)  # 13.04 GiB of bf16
    assert e.vllm_claim_gib == pytest.approx(48.0)
    assert e.rollout == pytest.approx({"vLLM (gpu_memory_utilization)": 48.0, "actor params": 4 * shard / GIB,
                                       "actor Adam states": 8 * shard / GIB, "reference": 0.0,
                                       "critic params + Adam states": 0.0})
    # padding-free (default): the fused head holds no (tokens, vocab) logits; without the model's shape only states
    assert e.training["logits (one micro-batch)"] == 0.0
    assert e.training_gib == pytest.approx((4 + 4 + 8) * shard / GIB)  # 13.04
    assert e.rollout_gib == pytest.approx(48 + 12 * shard / GIB)  # 57.8
    check_memory(e)  # fits
    padded = estimate_memory(7_000_000_000, 152_064, _config("data.max_response_length=2048",
                                                             "worker.actor.micro_batch_size_per_device_for_update=4",
                                                             "worker.actor.padding_free=false"), capacity_gib=80.0)
    logits = 2 * 4 * 2049 * 152_064 * 2 / GIB  # logits + their gradient, bf16: 4.65 GiB
    assert padded.training["logits (one micro-batch)"] == pytest.approx(logits)


def test_update_activations_of_a_seven_billion_model_by_hand():
    """Qwen2.5-7B's widths, 4 x (2048 + 2048) = 16384 update tokens per micro-batch, bf16 compute, 8 ranks."""
    config = _config("data.max_response_length=2048", "worker.actor.micro_batch_size_per_device_for_update=4")
    shape = ModelShape(hidden_size=3584, num_layers=28, intermediate_size=18944, tied=False)
    e = estimate_memory(7_000_000_000, 152_064, config, capacity_gib=80.0, shape=shape)
    tokens, embeddings = 16384, 2 * 152_064 * 3584
    layer = (7_000_000_000 - embeddings) / 28
    assert e.training["activations (checkpointed inputs)"] == pytest.approx(28 * tokens * 3584 * 2 / GIB)  # 3.1
    assert e.training["activations (layers in backward)"] == pytest.approx(
        tokens * (6 * 18944 + 11 * 3584) * 2 / GIB)  # 4.7
    assert e.training["unsharded weights + grads (FSDP2)"] == pytest.approx(
        (embeddings * 2 + layer * (2 + 2 + 4) + 152_064 * 3584 * 2) / GIB)  # 4.7
    no_checkpointing = estimate_memory(7_000_000_000, 152_064, _config(
        "data.max_response_length=2048", "worker.actor.micro_batch_size_per_device_for_update=4",
        "worker.actor.fsdp.enable_gradient_checkpointing=false"), capacity_gib=80.0, shape=shape)
    assert no_checkpointing.training["activations (layers in backward)"] == pytest.approx(
        tokens * (28 * (5 * 18944 + 7 * 3584) + 18944 + 4 * 3584) * 2 / GIB)  # all 28 layers kept: 25.7


def test_replayed_routing_of_a_micro_batch_by_hand():
    """R3 on Qwen3-30B-A3B's widths (48 layers, top-8): 16384 tokens x 48 x 8 int16 ids, padded and packed: 24 MiB."""
    shape = ModelShape(hidden_size=2048, num_layers=48, intermediate_size=8 * 768, tied=False, routed_width=8 * 2048)
    words = ("data.max_response_length=2048", "worker.actor.micro_batch_size_per_device_for_update=4")
    replayed = estimate_memory(30_000_000_000, 151_936, _config(*words, "worker.actor.router_replay.mode=R3"),
                               capacity_gib=80.0, shape=shape)
    assert replayed.training["replayed routing (R2/R3)"] == pytest.approx(2 * 16384 * 48 * 8 * 2 / GIB)
    plain = estimate_memory(30_000_000_000, 151_936, _config(*words), capacity_gib=80.0, shape=shape)
    assert "replayed routing (R2/R3)" not in plain.training


def _text(folder) -> ModelShape:
    """The text widths of ``model_shape`` (the vision tower's: tests/test_simulate_images.py)."""
    import dataclasses

    from transformers import AutoConfig

    return dataclasses.replace(model_shape(AutoConfig.from_pretrained(folder)), vision=None)


def test_model_shape_reads_text_config_and_experts():
    root = Path(__file__).resolve().parents[1] / "easyrl" / "model_configs"
    assert _text(root / "Qwen2.5-VL-3B-Instruct") == ModelShape(2048, 36, 11008, True)
    # a mixture of experts: 8 experts of width 768 per token, each token's hidden state routed to 8 of them
    assert _text(root / "Qwen3-VL-30B-A3B-Instruct") == ModelShape(
        2048, 48, 6144, False, routed_width=8 * 2048)
    # Gated DeltaNet: 48 value heads of width 128
    assert _text(root / "Qwen3.5-27B") == ModelShape(
        5120, 64, 17408, False, linear_value_width=48 * 128)


def test_offload_removes_the_actor_and_a_resident_reference_adds_its_shard():
    config = _config("worker.actor.offload.offload_params=true", "worker.ref.offload.offload_params=false")
    e = estimate_memory(8_000_000_000, 1000, config, capacity_gib=80.0)
    assert e.rollout["actor params"] == e.training["actor grads"] == e.rollout["actor Adam states"] == 0.0
    assert e.rollout["reference"] == pytest.approx(2 * 1e9 / GIB)


def test_lora_counts_the_frozen_base_without_grads_adam_or_reference():
    # resident reference (not offloaded) so that dropping it under LoRA shows: 8B, 8 ranks -> 1e9 per rank
    plain = _config("worker.ref.offload.offload_params=false")
    e = estimate_memory(8_000_000_000, 1000, _config("worker.ref.offload.offload_params=false",
                                                      "worker.actor.model.lora.rank=16"), capacity_gib=80.0)
    assert e.training["actor params"] == pytest.approx(4 * 1e9 / GIB)
    assert e.training["actor grads"] == e.training["actor Adam states"] == e.rollout["actor Adam states"] == 0.0
    assert e.rollout["reference"] == e.training["reference"] == 0.0
    full = estimate_memory(8_000_000_000, 1000, plain, capacity_gib=80.0)
    assert full.training_gib - e.training_gib == pytest.approx((4 + 8 + 2) * 1e9 / GIB)


def test_a_critic_adds_a_trained_copy():
    # adv_estimator gae: fp32 params + Adam (12 bytes per parameter) in both phases, + fp32 grads in training
    plain = estimate_memory(8_000_000_000, 1000, _config(), capacity_gib=80.0)
    e = estimate_memory(8_000_000_000, 1000, _config("algorithm.adv_estimator=gae"), capacity_gib=80.0)
    assert e.rollout_gib - plain.rollout_gib == pytest.approx(12 * 1e9 / GIB)
    assert e.training_gib - plain.training_gib == pytest.approx(16 * 1e9 / GIB)
    offloaded = _config("algorithm.adv_estimator=gae", "worker.critic.offload.offload_params=true")
    assert estimate_memory(8_000_000_000, 1000, offloaded, capacity_gib=80.0).training_gib == pytest.approx(
        plain.training_gib)


@pytest.mark.parametrize("params, capacity, overrides, culprit", [
    (32_000_000_000, 80.0, (), "worker.rollout.gpu_memory_utilization"),  # 59.6 GiB of bf16 weights > 48 GiB
    (7_000_000_000, 24.0, ("worker.rollout.gpu_memory_utilization=0.7",), "rollout phase needs"),  # 16.8 + 9.8
    (1_000_000_000, 24.0, ("worker.actor.micro_batch_size_per_device_for_update=16", "data.max_response_length=8192",
                           "worker.actor.padding_free=false"),
     "worker.actor.micro_batch_size_per_device_for_update"),  # padded 152k-vocab logits: 74 GiB
])
def test_a_run_that_cannot_fit_stops_naming_the_setting(params, capacity, overrides, culprit):
    config = _config(*overrides)
    with pytest.raises(ConfigError, match=culprit):
        check_memory(estimate_memory(params, 152_064, config, capacity_gib=capacity))


def test_every_phase_that_does_not_fit_is_named_with_advice_for_its_largest_items():
    """A 32B actor on 8 x 40 GiB, not offloaded: the rollout phase (its AdamW states, vLLM's claim) and the training
    phase (its states) are both over and both named, each with what shrinks its largest items: never the reference
    (offloaded by default: 0 GiB) nor a micro-batch (activations are a small share)."""
    shape = ModelShape(hidden_size=5120, num_layers=64, intermediate_size=27648, tied=False)
    e = estimate_memory(32_000_000_000, 152_064, _config("worker.rollout.tensor_parallel_size=8"), capacity_gib=39.4,
                        shape=shape)
    with pytest.raises(ConfigError) as error:
        check_memory(e)
    message = str(error.value)
    assert "The rollout phase needs" in message and "The training phase needs" in message
    assert "worker.actor.offload.offload_params=true" in message and "trainer.n_gpus_per_node" in message
    assert "lower worker.rollout.gpu_memory_utilization" in message
    assert "worker.ref.offload" not in message and "micro_batch_size_per_device_for_update" not in message
    # padded logits dominate a 1B model's update: the micro-batch, not offloading, not more devices
    padded = _config("worker.actor.micro_batch_size_per_device_for_update=16", "data.max_response_length=8192",
                     "worker.actor.padding_free=false")
    with pytest.raises(ConfigError) as error:
        check_memory(estimate_memory(1_000_000_000, 152_064, padded, capacity_gib=24.0))
    assert "The rollout phase" not in str(error.value) and "offload" not in str(error.value).split("GiB):")[-1]
    assert "n_gpus_per_node" not in str(error.value)


def test_offloaded_states_state_the_host_memory_a_node_needs():
    """Qwen2.5-14B (14.77B parameters) on 4 GPUs with the actor offloaded: its float32 parameters, gradients and
    AdamW states, 16 bytes per parameter (220 GiB, 236 GB), and the offloaded reference in bf16 live on the host."""
    config = _config("trainer.n_gpus_per_node=4", "worker.actor.offload.offload_params=true")
    e = estimate_memory(14_770_000_000, 152_064, config, capacity_gib=79.2)
    assert e.host == pytest.approx({"actor params + grads + Adam states": 16 * 14.77e9 / GIB,
                                    "reference": 2 * 14.77e9 / GIB})
    optimizer_only = _config("trainer.n_gpus_per_node=4", "worker.actor.offload.offload_optimizer=true",
                             "worker.ref.offload.offload_params=false")
    assert estimate_memory(14_770_000_000, 152_064, optimizer_only, capacity_gib=79.2).host == pytest.approx(
        {"actor Adam states (offload_optimizer)": 8 * 14.77e9 / GIB})


def test_tensor_parallelism_splits_the_engine_weights_so_32b_fits_on_80gb():
    # Qwen2.5-VL-32B in bf16: 59.6 GiB of weights do not fit in 0.6 x 80 GiB with one device per engine (the message
    # names tensor_parallel_size), 14.9 GiB per device with engines over 4 devices do (the actor offloaded to the host)
    offload = "worker.actor.offload.offload_params=true"
    single = estimate_memory(32_000_000_000, 152_064, _config(offload), capacity_gib=80.0)
    with pytest.raises(ConfigError, match=r"worker.rollout.tensor_parallel_size \(now 1\)"):
        check_memory(single)
    split = estimate_memory(32_000_000_000, 152_064, _config(offload, "worker.rollout.tensor_parallel_size=4"),
                            capacity_gib=80.0)
    assert split.vllm_weights_gib == pytest.approx(2 * 32e9 / 4 / GIB)
    check_memory(split)


def test_parameters_counted_on_the_meta_device(tiny_model_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tiny_model_path("qwen2_5")
    num, vocab = model_anatomy(AutoConfig.from_pretrained(path))[:2]
    assert num == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    assert vocab == AutoConfig.from_pretrained(path).vocab_size


def test_bf16_weights_bf16_moments_and_optimizer_offload_by_hand():
    """EasyR1's fsdp.torch_dtype=bf16 + optim.strategy=adamw_bf16 (its 32B recipe): 2 bytes per weight, gradient and
    moment; offload.offload_optimizer keeps the moments off the device during the rollout."""
    shard = 7e9 / 8
    e = estimate_memory(7_000_000_000, 152_064, _config("worker.actor.fsdp.torch_dtype=bf16",
                                                         "worker.actor.optim.strategy=adamw_bf16"), capacity_gib=80.0)
    assert (e.training["actor params"], e.training["actor grads"], e.training["actor Adam states"]) == pytest.approx(
        (2 * shard / GIB, 2 * shard / GIB, 4 * shard / GIB))
    offloaded = estimate_memory(7_000_000_000, 152_064, _config("worker.actor.offload.offload_optimizer=true"),
                                capacity_gib=80.0)
    assert offloaded.rollout["actor Adam states"] == 0.0 and offloaded.training["actor Adam states"] == pytest.approx(
        8 * shard / GIB)


def test_ulysses_splits_the_activations_so_32k_responses_fit():
    """Qwen2.5-7B, 32K-token responses, 2 per micro-batch, 8 A100-40GB: the update's activations (~33 GiB) do not fit
    on one device; with worker.actor.ulysses_size=4 each device holds a quarter of each sequence's."""
    shape = ModelShape(hidden_size=3584, num_layers=28, intermediate_size=18944, tied=False)
    words = ["data.max_response_length=32768", "worker.actor.micro_batch_size_per_device_for_update=2"]
    estimates = {sp: estimate_memory(7_615_616_512, 152_064, _config(*words, f"worker.actor.ulysses_size={sp}"),
                                     capacity_gib=40.0, shape=shape) for sp in (1, 4)}
    activations = {sp: e.training["activations (checkpointed inputs)"] + e.training["activations (layers in backward)"]
                   for sp, e in estimates.items()}
    assert activations[4] == pytest.approx(activations[1] / 4)
    with pytest.raises(ConfigError, match="The training phase needs .*worker.actor.ulysses_size"):
        check_memory(estimates[1])
    check_memory(estimates[4])


SPLIT = ("trainer.rollout_mode=one_step_off", "worker.rollout.n_gpus_per_node=2", "data.val_files=null")


def test_split_placement_counts_each_side_alone():
    """7B on 8 + 2 devices of 24 GiB, gpu_memory_utilization 0.7: colocated, the engine's 16.8 GiB claim beside the
    actor's float32 shard and AdamW states (9.8 GiB) is over; split (the engines on devices of their own), the
    trainer's side holds no engine and the rollout side no optimizer, and both fit."""
    colocated = estimate_memory(7_000_000_000, 152_064, _config("worker.rollout.gpu_memory_utilization=0.7"),
                                capacity_gib=24.0)
    with pytest.raises(ConfigError, match="The rollout phase needs"):
        check_memory(colocated)
    split = estimate_memory(7_000_000_000, 152_064, _config("worker.rollout.gpu_memory_utilization=0.7", *SPLIT),
                            capacity_gib=24.0)
    assert split.rollout_devices == 2 and colocated.rollout_devices == 0
    trainer, rollout = split.phases("trainer"), split.phases("rollout")
    assert all("vLLM (gpu_memory_utilization)" not in items for items in trainer.values()), trainer
    bucket = 2.0  # two buckets of 1024 MiB (update_weights_bucket_megabytes) arriving beside the engine (no shape)
    assert rollout == {"The rollout phase": {"vLLM (gpu_memory_utilization)": pytest.approx(0.7 * 24.0),
                                             "weight transfer (buckets + a layer's reload)": pytest.approx(bucket)}}
    assert split.rollout_gib == pytest.approx(colocated.rollout_gib - 12 * 7e9 / 8 / GIB + bucket)  # no AdamW
    assert split.training == colocated.training and "The rollout phase" in colocated.phases("trainer")
    check_memory(split)  # the trainer's side
    check_memory(split, "rollout")
    # the rollout side alone answers for the engine: 32B bf16 weights do not fit in one device's claim
    big = estimate_memory(32_000_000_000, 152_064, _config("worker.actor.offload.offload_params=true", *SPLIT),
                          capacity_gib=80.0)
    check_memory(big)
    with pytest.raises(ConfigError, match=r"worker.rollout.tensor_parallel_size \(now 1\)"):
        check_memory(big, "rollout")


def test_the_rollout_side_holds_the_transfer_beside_the_claim():
    """A split rollout device receives each bucket and reloads a layer beside vLLM's claim (device review S3-N10):
    Qwen2.5-7B's shape (its 152064 x 3584 embedding, 1.0 GiB in bf16, is the largest tensor; a layer 233M
    parameters) at gpu_memory_utilization 0.95 of 24 GiB leaves 1.2 GiB, less than two such buckets in flight and
    a layer: refused; at 0.85 it fits."""
    shape = ModelShape(hidden_size=3584, num_layers=28, intermediate_size=18944, tied=False,
                       largest_tensor=152_064 * 3584, largest_layer=233_000_000)
    high = estimate_memory(7_600_000_000, 152_064, _config("worker.rollout.gpu_memory_utilization=0.95", *SPLIT),
                           capacity_gib=24.0, shape=shape)
    transfer = high.rollout["weight transfer (buckets + a layer's reload)"]
    assert transfer == pytest.approx((2 * 152_064 * 3584 + 233_000_000) * 2 / GIB)
    with pytest.raises(ConfigError, match=r"weight transfer \(buckets \+ a layer's reload\) 2.5 GiB\): lower "
                                          "worker.rollout.gpu_memory_utilization"):
        check_memory(high, "rollout")
    check_memory(estimate_memory(7_600_000_000, 152_064, _config("worker.rollout.gpu_memory_utilization=0.85", *SPLIT),
                                 capacity_gib=24.0, shape=shape), "rollout")


def test_the_preflight_checks_its_workers_side(tiny_model_path):
    """A RolloutWorker's pre-flight checks the engine alone, an FSDPWorker's the training state: on one trainer
    device of 6 bytes per parameter the engine (2 bytes) fits in its 0.5 claim with a whole model's transfer beside
    it (a bucket larger than this model), AdamW training (16 bytes) does not."""
    from transformers import AutoConfig

    from easyrl.sizing.estimate import preflight

    path = tiny_model_path("qwen2_5")
    config = _config(f"worker.actor.model.model_path={path}", "trainer.n_gpus_per_node=1",
                     "worker.rollout.gpu_memory_utilization=0.5", *SPLIT)
    capacity = 6 * model_anatomy(AutoConfig.from_pretrained(path))[0] / GIB
    preflight(config, capacity, "rollout")
    with pytest.raises(ConfigError, match="The training phase needs"):
        preflight(config, capacity, "trainer")


@pytest.mark.parametrize("model_type", ["gpt_oss", "gemma4_text", "gpt2"])
def test_the_estimate_reads_families_admitted_by_their_self_check(model_type, tmp_path):  # issue #49
    """Families outside the registry that pass their self-check get a memory estimate (was: a traceback in the
    workers' pre-flight and ``easyrl simulate``): gpt-oss's class has no SDPA path (built eager), Gemma 4's
    ``head_dim`` varies by layer (the widest counts), GPT-2 names its MLP width ``n_inner`` (None: 4 x hidden)."""
    from transformers import AutoConfig

    from easyrl.sizing.estimate import estimate_run

    AutoConfig.for_model(model_type).save_pretrained(tmp_path)
    estimate = estimate_run(_config(f"worker.actor.model.model_path={tmp_path}"), capacity_gib=80.0)
    assert estimate.training_gib > 0
    shape = model_anatomy(AutoConfig.from_pretrained(tmp_path))[2]
    assert shape.attn_width == {"gpt_oss": 64 * 64, "gemma4_text": 8 * 512, "gpt2": 768}[model_type]
    if model_type == "gpt2":
        assert shape.intermediate_size == 4 * 768
