"""Efficiency signals by hand: the FLOPs formula (weights counted by hand for a tiny Qwen2.5-VL), MFU, peak FLOP/s per
device, throughput per phase, memory, and the fraction of GRPO groups with constant rewards."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import psutil
import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.device import memory_metrics
from easyrl.sizing.anatomy import ModelShape, VisionShape, model_anatomy
from easyrl.sizing.devices import peak_flops
from easyrl.sizing.flops import compute_mfu_metrics, forward_flops
from easyrl.trainer.metrics import MEASURED_PREFIXES, compute_throughput_metrics, frac_reward_zero_std, reduce_metrics


def _tiny_qwen2_5_vl_config():
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                           patch_size=14, temporal_patch_size=2, in_channels=3, spatial_merge_size=2),
    )


def test_weights_counted_like_a_hand_count():
    shape = model_anatomy(_tiny_qwen2_5_vl_config())[2]
    # language model, per layer: q 64x64, k and v 64x(2 kv heads x 16), o 64x64, gated MLP 3 x 64x96; LM head 1000x64
    # (tied to the embedding, but a matmul all the same); the embedding lookup itself is not counted
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 96
    assert shape.text_weights == 3 * per_layer + 1000 * 64
    assert (shape.num_layers, shape.attn_width) == (3, 64)
    # vision: patch embedding 3x2x14x14 -> 32; per block qkv 32x96, proj 32x32, gated MLP 3 x 32x48
    assert shape.vision.patch_weights == 3 * 2 * 14 * 14 * 32 + 2 * (32 * 96 + 32 * 32 + 3 * 32 * 48)
    # merger: 4 patches (2x2) concatenated, 128 -> 128 -> 64, once per merged token
    assert shape.vision.merge_weights == 128 * 128 + 128 * 64 and shape.vision.merge_size ** 2 == 4
    assert (shape.vision.depth, shape.vision.hidden_size) == (2, 32)


def test_forward_flops_formula_by_hand():
    vision = VisionShape(hidden_size=4, depth=1, intermediate_size=0, gated=False, patch_size=14, merge_size=2,
                         patch_dim=0, patch_weights=100, merge_weights=40)
    shape = ModelShape(hidden_size=0, num_layers=2, intermediate_size=0, tied=False, vision=vision, attn_width=8,
                       text_weights=1000)
    # two sequences of 10 and 20 tokens: 2*N*s + 4*L*(H*Q)*s^2
    text = (2 * 1000 * 10 + 4 * 2 * 8 * 100) + (2 * 1000 * 20 + 4 * 2 * 8 * 400)
    # one image of 16 patches: 2*N_patch*p + 2*N_merge*p/4 + 4*L_v*(H_v*Q_v)*p^2
    vision = 2 * 100 * 16 + 2 * 40 * 4 + 4 * 1 * 4 * 256
    assert forward_flops(shape, [10, 20], [16]) == text + vision

    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 11])  # 10 and 11 tokens
    inputs = [{"image_grid_thw": torch.tensor([[1, 4, 4]])}, {}]  # one image of 16 patches, one text-only sample
    timing = {"update_actor": 2.0, "gen": 1.0}
    metrics = compute_mfu_metrics(shape, mask, inputs, timing, world_size=2, peak=1e6, ppo_epochs=2)
    forward = forward_flops(shape, [10, 11], [16])
    assert metrics["perf/mfu/actor"] == pytest.approx(2 * 3 * forward / (2.0 * 2 * 1e6))
    assert metrics["perf/mfu/rollout"] == pytest.approx(forward / (1.0 * 2 * 1e6))
    assert compute_mfu_metrics(shape, mask, inputs, timing, world_size=2, peak=None, ppo_epochs=1) == {}
    assert compute_mfu_metrics(shape, mask, inputs, {"gen": 1.0}, world_size=2, peak=1e6, ppo_epochs=1).keys() == {
        "perf/mfu/rollout"}  # no update timed: no actor MFU


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA H100 NVL", 835), ("NVIDIA H800 PCIe", 756),
    ("NVIDIA H200", 989), ("NVIDIA H20", 148), ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA L20", 119.5), ("Ascend910B3", 354), ("cpu", None), ("Some Future GPU", None),
])
def test_peak_flops_per_device(name, tflops, monkeypatch):
    monkeypatch.delenv("EASYRL_PEAK_TFLOPS", raising=False)
    assert peak_flops(name) == (None if tflops is None else pytest.approx(tflops * 1e12))
    monkeypatch.setenv("EASYRL_PEAK_TFLOPS", "2.5")  # a stated nominal peak, e.g. for a CPU
    assert peak_flops(name) == pytest.approx(2.5e12)


def test_throughput_per_device_total_and_per_phase():
    batch = Batch(TensorDict({"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
                              "response_mask": torch.tensor([[1, 0], [1, 1]])}, batch_size=[2]))
    m = compute_throughput_metrics(batch, step_seconds=7.0, world_size=2, timing={"gen": 1.5, "update_actor": 2.0},
                                   ppo_epochs=2)
    assert m["perf/throughput"] == pytest.approx(7 / 7 / 2) and m["perf/throughput_total"] == pytest.approx(1.0)
    assert m["perf/rollout_tokens_per_s"] == pytest.approx(3 / 1.5)  # 3 generated tokens
    assert m["perf/update_tokens_per_s"] == pytest.approx(2 * 7 / 2.0)  # 2 epochs over 7 tokens


def test_measured_metrics_are_exactly_the_clock_and_memory_ones():
    """The rule that tells a resumed run's reproducible metrics from the measured ones (tests/test_e2e_resume.py)."""
    batch = Batch(TensorDict({"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
                              "response_mask": torch.tensor([[1, 0], [1, 1]])}, batch_size=[2]))
    throughput = compute_throughput_metrics(batch, 7.0, 2, timing={"gen": 1.5, "update_actor": 2.0})
    shape = model_anatomy(_tiny_qwen2_5_vl_config())[2]
    mfu_metrics = compute_mfu_metrics(shape, batch["attention_mask"], [{}, {}], {"gen": 1.0, "update_actor": 1.0}, 2,
                                      1e12, 1)
    measured = {*throughput, *mfu_metrics, "perf/cpu_memory_used_gb", "perf/max_memory_allocated_gb",
                "perf/max_memory_reserved_gb", "timing_s/gen", "timing_s/step"} - {"perf/total_num_tokens"}
    assert len(mfu_metrics) == 2 and all(key.startswith(MEASURED_PREFIXES) for key in measured), measured
    computed = ("perf/total_num_tokens", "perf/padding_fraction", "perf/max_rank_tokens_ratio", "actor/pg_loss",
                "actor/kl_loss", "critic/score/mean", "reward/overall", "reward/frac_reward_zero_std",
                "response_length/mean", "val/reward/overall", "actor/grad_norm", "rollout/log_prob_diff_max")
    assert not [key for key in computed if key.startswith(MEASURED_PREFIXES)]


def test_memory_metrics_and_their_reduction():
    m = memory_metrics("cpu")
    rss = psutil.Process().memory_info().rss / 2**30
    assert m["perf/cpu_memory_used_gb"] == pytest.approx(rss, rel=0.2)
    assert "perf/max_memory_allocated_gb" not in m  # the CPU has no allocator peaks
    merged = reduce_metrics({"perf/cpu_memory_used_gb": [1.0, 3.0], "perf/max_memory_allocated_gb": [2.0, 5.0],
                             "actor/pg_loss": [1.0, 3.0]})
    assert merged == {"perf/cpu_memory_used_gb": 3.0, "perf/max_memory_allocated_gb": 5.0, "actor/pg_loss": 2.0}


def test_frac_reward_zero_std_and_the_warning(caplog):
    uids = ["a", "a", "b", "b", "c", "c"]
    assert frac_reward_zero_std([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], uids) == pytest.approx(2 / 3)
    assert frac_reward_zero_std([0.0, 1.0, 0.0, 1.0, 0.5, 0.0], uids) == 0.0
    with pytest.raises(ValueError, match="one uid per score"):
        frac_reward_zero_std([1.0], uids)

    from easyrl.config import AlgorithmConfig
    from easyrl.trainer.ray_trainer import RayPPOTrainer

    trainer = SimpleNamespace(global_step=7, _last_frac_zero_std=None,
                              config=SimpleNamespace(algorithm=AlgorithmConfig(adv_estimator="grpo")))
    scores = torch.zeros(4, 3)
    batch = Batch(TensorDict({"token_level_scores": scores}, batch_size=[4]), {"uid": ["a", "a", "b", "b"]})
    with caplog.at_level(logging.WARNING, logger="easyrl.trainer"):
        assert RayPPOTrainer._check_reward_variance(trainer, batch) == 1.0
    assert "step 7: every one of the 2 groups has equal rewards (scores 0)" in caplog.text
    caplog.clear()
    trainer.global_step = 8  # still constant: the warning is not repeated
    with caplog.at_level(logging.WARNING, logger="easyrl.trainer"):
        assert RayPPOTrainer._check_reward_variance(trainer, batch) == 1.0
    assert caplog.text == ""
    scores[0, 2] = 1.0  # one group now varies: no warning
    with caplog.at_level(logging.WARNING, logger="easyrl.trainer"):
        assert RayPPOTrainer._check_reward_variance(trainer, batch) == 0.5
    assert caplog.text == ""
    scores[0, 2] = 0.0  # constant again: a new run of such steps warns again
    trainer.global_step = 10
    with caplog.at_level(logging.WARNING, logger="easyrl.trainer"):
        assert RayPPOTrainer._check_reward_variance(trainer, batch) == 1.0
    assert "step 10: every one" in caplog.text


def test_generation_rows_decode_the_first_samples(tiny_model_path):
    from transformers import AutoTokenizer

    from easyrl.trainer.metrics import generation_rows

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path("qwen2_5"))
    pad = tokenizer.pad_token_id
    prompt = tokenizer.encode("What is 1+1?")
    response = tokenizer.encode(" \\boxed{2}")
    prompts = torch.tensor([[pad] * 2 + prompt, [pad] * 2 + prompt, [pad] * 2 + prompt])
    responses = torch.tensor([response + [pad, pad], response[:1] + [pad] * (len(response) + 1), response + [pad] * 2])
    mask = torch.tensor([[1] * len(response) + [0, 0], [1] + [0] * (len(response) + 1), [1] * len(response) + [0, 0]])
    attention = torch.cat([(prompts != pad).long(), mask], dim=1)
    batch = Batch(TensorDict({"prompts": prompts, "responses": responses, "response_mask": mask,
                              "attention_mask": attention}, batch_size=[3]),
                  {"ground_truth": ["2", "3", "4"], "score/overall": [1.0, 0.0, 0.5]})
    rows = generation_rows(tokenizer, batch, 2)
    assert rows == [
        {"prompt": "What is 1+1?", "response": " \\boxed{2}", "ground_truth": "2", "score": 1.0},
        {"prompt": "What is 1+1?", "response": tokenizer.decode(response[:1]), "ground_truth": "3", "score": 0.0},
    ]
    assert generation_rows(tokenizer, batch, 0) == [] and len(generation_rows(tokenizer, batch, 9)) == 3
    # a judged multi-turn sample: its tool turn (response_mask 0) marked, the judge's raw answer beside it
    batch["response_mask"] = torch.tensor([[1, 0] + [1] * (len(response) - 2) + [0, 0]] * 3)
    batch["judge_verdict"] = ["Score: 1", None, "?"]
    (row,) = generation_rows(tokenizer, batch, 1)
    assert row["response"] == (tokenizer.decode(response[:1]) + f"<masked>{tokenizer.decode(response[1:2])}</masked>"
                               + tokenizer.decode(response[2:]))
    assert row["judge_verdict"] == "Score: 1"


def test_reward_metrics_over_every_generated_sample_else_the_batch():
    """One place writes ``reward/*``: a score the generator kept for every generated sample (dynamic sampling's
    dropped groups included) is averaged over those; a score only the batch holds (the judge's) over the batch."""
    from easyrl.trainer.metrics import reward_metrics

    batch = Batch(TensorDict({}, batch_size=[2]), {"score/overall": [1.0, 0.0], "score/judge": [0.5, 0.5]})
    metrics = reward_metrics(batch, {"overall": [1.0, 0.0, 0.0, 0.0]}, failures=2)
    assert metrics == {"reward/overall": 0.25, "reward/judge": 0.5, "reward/errors": 2.0}
    assert reward_metrics(batch, {}, failures=0)["reward/overall"] == 0.5
    assert reward_metrics(batch, {}, 0, frac_zero_std=1.0)["reward/frac_reward_zero_std"] == 1.0  # the step's too


def test_startup_profile_is_reported_once_with_the_first_step(caplog):
    """``timing_s/startup/*`` in the first metrics row and one console line; the first sync (step 1's reshard) is
    named apart, the step itself is not start-up, and what no phase covers is ``other``."""
    import logging
    import time

    from easyrl.trainer.launch import StartupProfile

    profile = StartupProfile(start=time.time() - 30.0)
    for phase, seconds in (("ray", 5.0), ("workers", 10.0), ("imports", 8.0), ("actor", 2.0), ("engine", 6.0)):
        profile.add(phase, seconds)
    with caplog.at_level(logging.INFO, logger="easyrl"):
        metrics = profile.report({"timing_s/step": 4.0, "timing_s/reshard": 0.5})
    assert metrics["timing_s/startup/total"] == pytest.approx(26.0, abs=0.5)  # 30 s since the start, less the step
    assert metrics["timing_s/startup/first_sync"] == 0.5 and metrics["timing_s/startup/engine"] == 6.0
    assert metrics["timing_s/startup/other"] == pytest.approx(3.0, abs=0.5)  # imports are inside workers
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("startup ")]
    assert line.startswith("startup 26.") and "workers 10.0 (imports 8.0)" in line and line.endswith("first_sync 0.5")
    assert profile.report({"timing_s/step": 4.0}) == {}  # once
