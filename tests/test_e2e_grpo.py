"""End to end on the CPU: GRPO with 2 Ray workers, each an FSDP2 (gloo) rank holding the actor, the reference policy
and an in-process vLLM engine; a tiny Qwen2.5-VL (real classes, random weights) on the real Geometry3K sample.

Nothing is mocked: vLLM, Ray, FSDP2, transformers, datasets, OmegaConf all run for real. Each module-level trainer
costs ~2 minutes of start-up on 2 cores (Ray ~15 s, vLLM engines + multimodal profiling), so the assertions share one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from easyrl.testing.worker import InspectableWorker, actor_log_probs_of
from easyrl.workers.mm_staging import multi_modal_nbytes

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
# vLLM's CPU kernels and the FSDP2/transformers forward are both float32 here; measured max |diff| of per-token
# log-probs between them was 1.9e-6 on a step of this model, so 1e-4 (50x) fails on any real plumbing error (a wrong
# temperature, position, image or weight) while leaving room for kernel differences. In bf16 (the GPU default:
# worker.actor.fsdp.param_dtype and worker.rollout.dtype) gaps are orders of magnitude larger: bf16 keeps ~3
# significant digits, so per-token gaps of 1e-2 and more are normal (tests/gpu/test_gpu_actor.py allows 0.05 for a
# bf16 copy); in training that is what the rollout/* metrics and TIS (worker.actor.tis_cap) watch.
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def vl_trainer(local_ray, e2e_config, tmp_path_factory):
    from easyrl.trainer.__main__ import build_trainer

    local_ray()
    config = e2e_config("qwen2_5_vl", tmp_path_factory.mktemp("vl") / "runs", "trainer.max_steps=2",
                        "trainer.val_freq=-1", "worker.rollout.calculate_log_probs=true",
                        "data.max_response_length=16")  # the demo's 48 tokens: 3x the decoding, nothing more to see
    trainer = build_trainer(config, worker_cls=InspectableWorker)
    yield trainer
    trainer.close()


def _max_abs_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_grpo_two_steps_two_ranks(vl_trainer):
    trainer = vl_trainer
    workers = trainer.workers
    assert workers.world_size == 2
    features = iter(trainer.train_dataloader)
    weights_0 = workers.run_all(InspectableWorker.actor_state_dict)[0]

    trainer.global_step = 1
    metrics_1 = trainer.train_step(features)
    weights_1 = workers.run_all(InspectableWorker.actor_state_dict)
    # FSDP2 gathers the same full weights on both ranks, and the update changed them
    assert _max_abs_diff(weights_1[0], weights_1[1]) == 0.0
    assert _max_abs_diff(weights_0, weights_1[0]) > 1e-4
    assert metrics_1["critic/advantages/max"] > 0  # the test reward varies within groups: the policy loss trains

    # step 2's rollout must have sampled with the step-1 weights: vLLM's log-probs of its own samples equal the
    # actor's (old_log_probs, computed with the step-1 weights), and differ from the initial weights' (ref_log_probs)
    trainer.global_step = 2
    trainer.peak_flops = 1e12  # a nominal 1 TFLOP/s device: the CPU has no listed peak, so no MFU otherwise
    metrics_2 = trainer.train_step(features)
    trainer.peak_flops = None
    assert metrics_2["rollout/log_prob_diff_max"] < LOGPROB_TOL, metrics_2["rollout/log_prob_diff_max"]
    batch = trainer.last_batch
    stale_gap = ((batch["rollout_log_probs"] - batch["ref_log_probs"]).abs() * batch["response_mask"]).max().item()
    assert stale_gap > 10 * LOGPROB_TOL, stale_gap  # the initial weights would have been told apart
    # the images' processor outputs reached the workers once in the step (staged after balancing), not once per pass
    # (old log-probs, ref log-probs, update: 3x without staging)
    sent = multi_modal_nbytes(batch["multi_modal_inputs"])
    assert metrics_2["perf/multi_modal_bytes_to_workers"] == sent > 0, (metrics_2["perf/multi_modal_bytes_to_workers"],
                                                                        sent)
    required = [
        "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
        "timing_s/update_actor", "timing_s/reshard", "timing_s/step",
        "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm",
        "actor/lr", "perf/total_num_tokens", "perf/time_per_step", "perf/throughput",
    ]
    required += [f"critic/{k}/{s}" for k in ("score", "rewards", "advantages") for s in ("mean", "max", "min")]
    required += [f"{k}/{s}" for k in ("response_length", "prompt_length") for s in ("mean", "max", "min")]
    for metrics in (metrics_1, metrics_2):
        missing = [k for k in required if k not in metrics]
        assert not missing, missing
        assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics_2["actor/kl_loss"] > 0  # the actor moved away from the reference policy
    _check_perf_signals(metrics_1, metrics_2, trainer.last_batch)


def _check_perf_signals(metrics_1: dict, metrics_2: dict, batch) -> None:
    """Signals of issue #11 on a real step: constant-reward groups, the weight sync timed apart from generation,
    throughput per phase, MFU (only with a peak), the workers' memory."""
    groups: dict[str, set] = {}
    for uid, score in zip(batch["uid"], batch["token_level_scores"].sum(-1).tolist()):
        groups.setdefault(uid, set()).add(score)
    constant = sum(len(scores) == 1 for scores in groups.values()) / len(groups)
    assert metrics_2["reward/frac_reward_zero_std"] == pytest.approx(constant)
    for m in (metrics_1, metrics_2):
        assert m["timing_s/gen"] + m["timing_s/reshard"] <= m["timing_s/step"]
        generated = m["response_length/mean"] * len(batch)
        assert m["perf/rollout_tokens_per_s"] == pytest.approx(generated / m["timing_s/gen"], rel=1e-4)
        assert m["perf/throughput_total"] == pytest.approx(2 * m["perf/throughput"])
        assert 0.5 < m["perf/cpu_memory_used_gb"] < 20  # a worker holds vLLM, the actor and the reference
    assert metrics_1["timing_s/reshard"] > 0  # the first rollout synced the actor's weights into vLLM
    assert "perf/mfu/actor" not in metrics_1  # CPU: no peak, no MFU
    assert 0 < metrics_2["perf/mfu/actor"] < 1 and 0 < metrics_2["perf/mfu/rollout"] < 1


def test_vllm_matches_actor_after_weight_sync(vl_trainer):
    """After a sync, vLLM scores a fixed image+text sequence like the FSDP2 actor does, token by token."""
    trainer = vl_trainer
    features = next(iter(trainer.train_dataloader))
    prompts = trainer.generator.prompt_batch(features, 2, trainer.global_step)  # 2 workers: one copy each
    response = trainer.tokenizer.encode(" The answer is \\boxed{80}.", add_special_tokens=False)
    batch = trainer.generator.generate(prompts, overrides=None, timing={})  # also syncs the current actor weights
    actor = actor_log_probs_of(trainer, batch, response)

    prompt_ids = features["prompt_ids"][0]
    expanded, vllm_scores = trainer.workers.run_all(
        InspectableWorker.rollout_score, features["raw_prompt_ids"][0] + response, features["images"][0])[0]
    assert expanded == prompt_ids + response  # vLLM expanded the image pads exactly like the processor
    vllm_response = torch.tensor(vllm_scores[len(prompt_ids) - 1:])
    assert vllm_response.shape == actor.shape
    assert (vllm_response - actor).abs().max().item() < LOGPROB_TOL
    assert actor.min() < -1.0  # a random model: the check compares real, non-trivial log-probs


def test_weight_sync_refuses_a_missing_key(vl_trainer):
    """vLLM's reload_weights only warns about a parameter it did not receive; the sync must stop instead."""
    import ray

    def _sync_without(worker, dropped: str) -> str:
        """On a worker (``__ray_call__``): sync the actor's weights minus ``dropped`` (a key vLLM would not recognise,
        e.g. renamed), return the error; then sync them all again."""
        from easyrl.workers import weight_sync
        from easyrl.workers.fsdp_model import TORCH_DTYPES

        state = {k: v for k, v in worker.actor.model.state_dict().items() if k != dropped}
        dtype = TORCH_DTYPES[worker.config.worker.rollout.dtype]
        args = (worker.rollout, worker.device, worker.torch_device, dtype, 2**20)
        try:
            weight_sync.sync_weights(state, *args)
            error = ""
        except RuntimeError as e:
            error = str(e)
        weight_sync.sync_weights(worker.actor.model.state_dict(), *args)
        return error

    workers = vl_trainer.workers.workers
    errors = ray.get([w.__ray_call__.remote(_sync_without, "model.language_model.norm.weight") for w in workers])
    for error in errors:
        assert "1 of vLLM's" in error and "norm.weight" in error, error


def test_export_and_jsonl(vl_trainer, capsys):
    """fit() writes the JSONL metrics and a Hugging Face folder that transformers loads; the console shows the step's
    summary line and the progress bar."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    trainer = vl_trainer
    trainer.global_step = 0
    trainer.training_steps = 1
    trainer.config.trainer.val_freq = 1
    trainer.fit()
    run_dir = Path(trainer.config.trainer.run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert "val/reward/overall" in rows[0] and "timing_s/gen" in rows[0]
    generations = rows[0]["val/generations"]  # trainer.val_generations_to_log: 2 in the demo config
    assert len(generations) == 2 and all(g["prompt"].startswith("system\n") for g in generations)
    assert [g["ground_truth"] for g in generations] == [trainer.val_dataset[i]["ground_truth"] for i in range(2)]
    assert all(g["response"] and 0.0 <= g["score"] <= 1.0 for g in generations)
    console = capsys.readouterr().err
    assert f"step 1/1 | reward {rows[0]['critic/score/mean']:.3f}" in console and "training: 100%" in console
    exported = run_dir / "huggingface"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
                 "processor_config.json"):
        assert (exported / name).exists(), name
    model = AutoModelForImageTextToText.from_pretrained(exported)
    AutoProcessor.from_pretrained(exported)
    actor = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
    exported_state = model.state_dict()
    assert {exported_state[k].dtype for k in actor} == {torch.bfloat16}  # the base model's dtype (its config's)
    assert _max_abs_diff({k: actor[k].to(torch.bfloat16) for k in actor}, {k: exported_state[k] for k in actor}) == 0.0
