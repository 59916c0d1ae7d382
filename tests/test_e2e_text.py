"""End to end with the text-only tiny Qwen2.5 (Qwen2ForCausalLM, real Qwen2.5 vocabulary) on the Geometry3K sample with
its images dropped by the dataset, through the same path as the VL job (``build_trainer`` + ``fit``). Two runs of 2
GRPO steps (float32) on 2 CPU workers serve most checks (start-up is the expensive part on a CPU):

- rollout tensor parallelism (``worker.rollout.tensor_parallel_size``): one vLLM engine split over both ranks (2,
  vLLM's ``external_launcher`` executor over the workers' gloo group), then an engine per rank (1). Both must have
  finite metrics and vLLM/actor log-prob parity after each weight sync (step 2's sync carries the updated weights,
  which each TP rank's engine shards itself); the TP engine must span exactly the ranks the dispatch gives one share
  (``easyrl.workers.rollout_layout``); the two runs sample the same responses in step 1 (same weights, same per-sample
  seeds: a prompt dispatched to the wrong engine or a response collected from the wrong rank would differ); and the
  shared memory of the TP engine is released at shutdown;
- the run with an engine per rank trains with Ulysses sequence parallelism over both workers
  (``worker.actor.ulysses_size=2``: one data-parallel group, each packed row split over both ranks; the rollout does
  not see it): the actor's log-probs through the all-to-alls equal vLLM's own, and the update moves the weights;
- that run goes through ``fit()`` with validation: its metrics, start-up profile and Hugging Face export; before it,
  a planted broken weight sync stops its first step before the update (then the sync is repaired and the stream
  rewound, so that ``fit()`` starts as if nothing had run)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from easyrl.testing.worker import InspectableWorker

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
LOGPROB_TOL = 1e-4  # float32 on both sides; measured 1.9e-6 with TP 2 and 1 (as tests/test_e2e_grpo.py)
TP_SHM = ("-[0-1]-cpushm_0", "-[0-1]-cpushm_1")  # the CPU TP all-reduce buffers of a 2-rank group


def _broken_first_step(trainer, train_step, key: str) -> tuple:
    """Step 1 with the Hugging Face tensor ``key`` left out of every weight sync (``InspectableWorker.break_sync``):
    ``(the exception it raised or None, actor weights before, after)``; then the sync is repaired, the prompt stream
    rewound and the step counter reset."""
    import ray

    position = trainer.train_dataloader.state_dict()
    trainer.workers.run_all(InspectableWorker.break_sync, key)
    before = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
    trainer.global_step = 1
    try:
        train_step(trainer.prompt_stream())
        error = None
    except Exception as e:  # the test names what it expects
        error = e
    after = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]

    def repair(worker) -> None:  # nested: Ray pickles it by value
        vars(worker.rollout).pop("load_weights")  # break_sync's wrapper: the rollout's own method again
        worker.weights_dirty = True  # the weights did not change, but vLLM's must be written again

    ray.get([w.__ray_call__.remote(repair) for w in trainer.workers.workers])
    trainer.train_dataloader.load_state_dict(position)
    trainer.global_step = 0
    return error, before, after


def _run(e2e_text_config, local_ray, runs_root, tp: int, *overrides: str, fit: bool = False) -> dict:
    """Two steps with ``tensor_parallel_size=tp``, through ``trainer.fit()`` after a broken first step
    (``_broken_first_step``; ``fit``) or two bare steps; the engines' TP groups, each step's metrics and batch, the
    ``(world, dp)`` sizes, the run folder, the /dev/shm entries left after shutdown and (``fit``) the broken step's
    outcome and the actor's weights before and after step 1."""
    import ray

    from easyrl.trainer.__main__ import build_trainer

    def tp_group_ranks(worker) -> list[int]:  # runs inside vLLM's worker (nested: Ray pickles it by value)
        from vllm.distributed.parallel_state import get_tp_group

        return list(get_tp_group().ranks)

    local_ray()  # before the snapshot: a Ray started now adds its own segments
    shm_before = set(os.listdir("/dev/shm"))
    config = e2e_text_config(runs_root, f"worker.rollout.tensor_parallel_size={tp}", "trainer.save_freq=-1",
                             *overrides)
    trainer = build_trainer(config, worker_cls=InspectableWorker)
    steps, batches, weights = [], [], []
    train_step = trainer.train_step

    def recording_step(stream):  # fit() calls trainer.train_step: every step's metrics and batch, weights of step 1
        if fit and not steps:
            weights.append(trainer.workers.run_all(InspectableWorker.actor_state_dict)[0])
        steps.append(train_step(stream))
        batches.append(trainer.last_batch)
        if fit and len(steps) == 1:
            weights.append(trainer.workers.run_all(InspectableWorker.actor_state_dict)[0])
        return steps[-1]

    trainer.train_step = recording_step
    broken = None
    try:
        groups = ray.get([worker.__ray_call__.remote(lambda w: w.rollout.llm.collective_rpc(tp_group_ranks)[0])
                          for worker in trainer.workers.workers])
        sizes = (trainer.workers.world_size, trainer.workers.dp_size)
        if fit:
            broken = _broken_first_step(trainer, train_step, "model.layers.0.input_layernorm.weight")
            trainer.fit()
        else:
            stream = trainer.prompt_stream()
            for step in (1, 2):
                trainer.global_step = step
                trainer.train_step(stream)
    finally:
        trainer.close()
    # (FSDPWorker.close releases the TP group's shared memory, not left in /dev/shm by the killed workers)
    return {"groups": groups, "steps": steps, "batches": batches, "weights": weights, "sizes": sizes,
            "run_dir": Path(config.trainer.run_dir), "shm_left": set(os.listdir("/dev/shm")) - shm_before,
            "broken": broken}


@pytest.fixture(scope="module")
def tp2(e2e_text_config, local_ray, tmp_path_factory):
    return _run(e2e_text_config, local_ray, tmp_path_factory.mktemp("tp2"), 2)


@pytest.fixture(scope="module")
def tp1_ulysses(e2e_text_config, local_ray, tmp_path_factory):
    """An engine per rank, the actor under Ulysses, through ``fit()`` with validation after step 2 (the last)."""
    sample = REPO / "examples" / "data" / "geometry3k_sample"
    return _run(e2e_text_config, local_ray, tmp_path_factory.mktemp("tp1"), 1, "worker.actor.ulysses_size=2",
                f"data.val_files={sample}", "trainer.val_freq=2", fit=True)


def _check_run(run: dict, tp: int) -> None:
    """Finite metrics and vLLM/actor parity after each step's sync; no shared memory left after shutdown."""
    assert len(run["steps"]) == 2
    for metrics in run["steps"]:
        print(f"ROLLOUT_TP tp={tp} parity={metrics['rollout/log_prob_diff_max']:.3g} "
              f"gen_s={metrics['timing_s/gen']:.2f}")
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert metrics["rollout/log_prob_diff_max"] < LOGPROB_TOL, (tp, metrics["rollout/log_prob_diff_max"])
    # the TP group's shared memory (vLLM's 24 MiB broadcast ring, the CPU all-reduce buffers) is released at shutdown
    assert run["shm_left"] == set()
    assert not [name for name in os.listdir("/dev/shm") if name.endswith(TP_SHM)]


def test_tensor_parallel_2_on_two_ranks(tp2):
    """One engine over both ranks (``make test-compat`` runs this half on vLLM 0.23)."""
    _check_run(tp2, 2)
    assert tp2["groups"] == [[0, 1], [0, 1]]


def test_an_engine_per_rank_samples_what_the_split_engine_sampled(tp2, tp1_ulysses):
    _check_run(tp1_ulysses, 1)
    assert tp1_ulysses["groups"] == [[0], [1]]
    first_tp2, first_tp1 = tp2["batches"][0], tp1_ulysses["batches"][0]
    assert first_tp2["responses"].tolist() == first_tp1["responses"].tolist()
    gap = (first_tp2["rollout_log_probs"] - first_tp1["rollout_log_probs"]).abs().max().item()
    print(f"ROLLOUT_TP tp2_vs_tp1 rollout log-prob gap {gap:.3g}")
    assert gap < 1e-4


def test_grpo_step_with_ulysses_over_two_workers(tp1_ulysses):
    """One data-parallel group of 2 ranks; the actor's log-probs went through the all-to-alls; the update moved the
    weights."""
    assert tp1_ulysses["sizes"] == (2, 1)
    assert tp1_ulysses["steps"][0]["rollout/log_prob_diff_max"] < LOGPROB_TOL
    assert all(math.isfinite(v) for v in tp1_ulysses["steps"][0].values() if isinstance(v, float))
    before, after = tp1_ulysses["weights"]
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-6


def test_text_model_trains_validates_and_exports(tp1_ulysses):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = tp1_ulysses["run_dir"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(v) for k, v in row.items() if isinstance(v, float)), row
        assert row["prompt_length/max"] < 200  # no image tokens in a text-only prompt
        # left-padded text prompts: the actor's positions must match vLLM's (which sees no padding)
        assert row["rollout/log_prob_diff_max"] < 2e-3
        assert row["rollout/log_prob_diff_median"] < 1e-4  # fp32: the sync check's statistic, 1000x under its bound
    assert "val/reward/overall" in rows[-1] and rows[0]["critic/advantages/max"] > 0
    # the start-up profile, in the first row only (easyrl.trainer.launch.StartupProfile)
    first = rows[0]
    assert first["timing_s/startup/total"] > first["timing_s/startup/engine"] > 0
    assert "timing_s/startup/first_sync" in first
    exported = run_dir / "huggingface"
    AutoModelForCausalLM.from_pretrained(exported)
    assert AutoTokenizer.from_pretrained(exported).eos_token == "<|im_end|>"


def test_a_broken_weight_sync_stops_the_first_step_before_the_update(tp1_ulysses):
    """One tensor skipped by the sync keeps vLLM's start-up dummy values (~0): the sync check (on by default) stops
    step 1 after the old-log-prob pass, before the update, with the metric, the bound and the key in the message."""
    from easyrl.errors import user_error_of
    from easyrl.workers.weight_sync import WeightSyncError

    failure, before, after = tp1_ulysses["broken"]
    assert failure is not None, "the broken sync went unnoticed"
    error = user_error_of(failure)
    assert isinstance(error, WeightSyncError), failure
    assert "rollout/log_prob_diff_median" in str(error) and "worker.actor.rollout_sync_threshold = 0.1" in str(error)
    assert all(torch.equal(before[key], after[key]) for key in before)  # no update ran
