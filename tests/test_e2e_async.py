"""End to end with the rollout on a device of its own (``trainer.rollout_mode: one_step_off`` and ``async``): one
trainer worker (FSDP2) and one rollout worker (vLLM) on the tiny text model; the engine generates ahead while the
trainer trains, and the weights cross between them by the transfer group (``easyrl.workers.weight_transfer``).
The features of the colocated placement run here too: one step off with an LLM judge (SmolLM2, on the trainer's
worker); async with multi-turn tool calls, a LoRA actor and validation."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from easyrl.testing.worker import InspectableWorker, actor_log_probs_of
from easyrl.testing.smollm2 import smollm2_path
from easyrl.trainer.async_rollout import ONE_STEP

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tests" / "agent_tools"


def _vllm_minus_actor(trainer, features, response: list[int]) -> float:
    """The largest gap between vLLM's and the actor's log-probs of ``response`` after the first prompt."""
    prompts = trainer.generator.prompt_batch(features, 1, trainer.global_step)
    batch = trainer.generator.generate(prompts, overrides=None, timing={})  # the layout of a generated batch
    actor = actor_log_probs_of(trainer, batch, response)
    prompt_ids = features["prompt_ids"][0]
    expanded, scores = trainer.placement.engines.run_all(
        InspectableWorker.rollout_score, features["raw_prompt_ids"][0] + response, features["images"][0])[0]
    assert expanded == prompt_ids + response
    return (torch.tensor(scores[len(prompt_ids) - 1:]) - actor).abs().max().item()


def _check_a_partial_rollout(trainer, features) -> None:
    """Send weights while a group generates (the engine holds step 3's, the trainer step 2's after a resume): the
    requests stay in flight, their later tokens are tagged with the new version, and each of those has the log-prob
    that the engine now gives it."""
    prompts = trainer.generator.prompt_batch(features, 4, trainer.global_step)
    generated = {}
    streaming = trainer.placement.streaming  # single-turn requests on the stream the trainer's rollout shares
    stream = streaming.stream  # opened here (if an earlier call did not), before the generating thread uses it
    returned = stream.returned  # the engine calls so far (the stream is idle: none in flight)
    thread = threading.Thread(target=lambda: generated.update(batch=streaming.generate(prompts, None)[0]))
    thread.start()
    while stream.returned == returned:  # the engine sampled a first few tokens (one call: at most 16 steps)
        time.sleep(0.01)
    trainer.batches.update_engines()  # waits for the engine call in flight (at most 16 decode steps), keeps the requests
    thread.join()
    batch = generated["batch"]
    versions, mask = batch["token_versions"], batch["response_mask"].bool()
    spans = [i for i in range(len(batch)) if set(versions[i][mask[i]].tolist()) == {3, 2}]
    assert spans, versions  # a response holds tokens of both weight versions
    i = spans[0]
    response = batch["responses"][i][mask[i]].tolist()
    prompt_ids = features["prompt_ids"][0]
    expanded, scores = trainer.placement.engines.run_all(
        InspectableWorker.rollout_score, features["raw_prompt_ids"][0] + response, features["images"][0])[0]
    assert expanded == prompt_ids + response
    now = torch.tensor(scores[len(prompt_ids) - 1:])
    sampled, new = batch["rollout_log_probs"][i][mask[i]], versions[i][mask[i]] == 2
    assert (sampled[new] - now[new]).abs().max() < 2e-3 < (sampled[~new] - now[~new]).abs().max()


def test_one_step_off_trains_one_step_old_samples_judged_and_sends_the_weights(e2e_text_config, trainer_on_ray,
                                                                               tmp_path):
    config = e2e_text_config(tmp_path, "trainer.rollout_mode=one_step_off", "worker.rollout.n_gpus_per_node=1",
                             "trainer.n_gpus_per_node=1", "data.rollout_batch_size=2", "trainer.max_steps=3",
                             "worker.rollout.update_weights_bucket_megabytes=1",  # several buckets, one per broadcast
                             "algorithm.use_kl_loss=false",  # no reference model: a shorter run
                             f"worker.reward.judge.model_path={smollm2_path()}",  # on the trainer's worker
                             f"worker.reward.judge.prompt_template={REPO / 'easyrl/rewards/judge.jinja'}",
                             "worker.reward.judge.max_tokens=8", "worker.reward.judge.max_model_len=1024")
    with trainer_on_ray(config, worker_cls=InspectableWorker) as trainer:
        trainer.fit()
        rows = [json.loads(line) for line in (Path(config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()]
        # the first batch is sampled by the start weights, every later one by the weights one update older
        assert [row["async/staleness_max"] for row in rows] == [0, 1, ONE_STEP]
        assert set(trainer.last_batch["version_gap"]) == {1} and set(trainer.last_batch["weight_version"]) == {1}
        batches = trainer.batches
        assert (batches.version, batches.engine_version) == (3, 2)  # sent at step 3 (the trainer's first thing)
        assert rows[0]["timing_s/weight_transfer"] > 0 and all(row["async/train_idle_s"] >= 0 for row in rows)
        assert all(row["async/rollout_idle_s"] >= 0 and row["async/train_tokens_per_s"] > 0 for row in rows[:2])
        # every step's responses judged (a verdict each, scored or counted unparseable)
        assert all(row["timing_s/judge"] > 0 and "judge/unparseable" in row for row in rows)
        assert len(trainer.last_batch["judge_verdict"]) == len(trainer.last_batch)
        features = next(iter(trainer.train_dataloader))
        response = trainer.tokenizer.encode(" The answer is \\boxed{80}.", add_special_tokens=False)
        stale = _vllm_minus_actor(trainer, features, response)  # the engine holds version 2, the actor version 3
        batches.update_engines()
        synced = _vllm_minus_actor(trainer, features, response)
        assert synced < 2e-3 < stale  # the transfer moved version 3


def test_async_multi_turn_lora_validation_bounds_the_staleness_and_resumes_at_the_trained_prompts(
        e2e_text_config, trainer_on_ray, tmp_path):
    config = e2e_text_config(tmp_path, "trainer.rollout_mode=async", "trainer.max_staleness=2",
                             "worker.rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1",
                             "data.rollout_batch_size=2", "data.mini_rollout_batch_size=1", "trainer.max_steps=3",
                             "trainer.save_freq=2", "algorithm.use_kl_loss=false",
                             "data.max_response_length=64",  # room for a response to outlast a weight transfer
                             "worker.actor.model.lora.rank=4", "worker.actor.model.lora.alpha=8",
                             f"data.val_files={REPO / 'examples/data/geometry3k_sample'}", "trainer.val_freq=3",
                             "worker.rollout.multi_turn.enable=true",  # each trajectory's turns by request
                             f"worker.rollout.multi_turn.tools=[{TOOLS / 'tools.py'}:echo]",
                             f"worker.rollout.multi_turn.format={TOOLS / 'parser.py'}:every_turn",
                             "worker.rollout.multi_turn.max_assistant_turns=2",
                             "worker.rollout.multi_turn.max_turn_tokens=8")
    with trainer_on_ray(config, worker_cls=InspectableWorker) as trainer:
        trained, train_step = [], trainer.train_step

        def recording(stream):  # each trained step's prompts, in generation order
            metrics = train_step(stream)
            trained.append([tuple(p) for p in trainer.last_batch["raw_prompt_ids"][::config.worker.rollout.n]])
            return metrics

        trainer.train_step = recording
        trainer.fit()
        rows = [json.loads(line) for line in (Path(config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()]
        assert all(row["async/staleness_max"] <= 2 and row["async/dropped_groups"] == 0 for row in rows)
        assert rows[0]["async/staleness_max"] == 0 and max(row["async/staleness_max"] for row in rows) > 0
        assert [sum(row[f"async/staleness_gap_{g}"] for g in range(3)) for row in rows] == [8] * 3
        assert all(row["multi_turn/tool_calls"] > 0 for row in rows)  # tool turns, through the shared stream
        assert "val/reward/overall" in rows[-1] and all("val/reward/overall" not in row for row in rows[:-1])
        # each trained token is tagged with the weights that sampled it (tool tokens: -1), the sample with the oldest
        assert 0 < rows[0]["rollout/slot_occupancy"] <= 1
        versions, mask = trainer.last_batch["token_versions"], trainer.last_batch["response_mask"].bool()
        assert ((versions >= 0) == mask).all() and (versions[:, 1:] >= versions[:, :-1]).logical_or(~mask[:, 1:]).all()
        assert [min(v[m].tolist()) for v, m in zip(versions, mask)] == trainer.last_batch["weight_version"]
        features = next(iter(trainer.train_dataloader))
        response = trainer.tokenizer.encode(" The answer is \\boxed{80}.", add_special_tokens=False)
        trainer.batches.update_engines()
        assert _vllm_minus_actor(trainer, features, response) < 2e-3  # the transfer moved the merged LoRA weights
        # resume step 2's checkpoint (saved while step 3's chunks were generated ahead): step 3 trains the same prompts
        assert len({p for step in trained for p in step}) == 6
        trainer.load_checkpoint(str(Path(trainer.last_checkpoint).parent / "global_step_2"))
        _check_a_partial_rollout(trainer, features)
        trainer.global_step += 1
        trainer.train_step(trainer.prompt_stream())
        assert trained[3] == trained[2] and trainer.batches.version == 3
