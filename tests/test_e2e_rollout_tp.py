"""Rollout tensor parallelism (``worker.rollout.tensor_parallel_size``) through the real loop on 2 CPU workers: the
same 2 GRPO steps (tiny Qwen2.5, float32) once with one vLLM engine split over both ranks (``tensor_parallel_size=2``,
vLLM's ``external_launcher`` executor over the workers' gloo group) and once with an engine per rank (1).

Both runs must have finite metrics and vLLM/actor log-prob parity after each weight sync (step 2's sync carries the
updated weights, which each TP rank's engine shards itself); the TP engine must span exactly the ranks the dispatch
gives one share (``easyrl.workers.rollout_layout``); and the two runs sample the same responses in step 1 (same
weights, same per-sample seeds: a prompt dispatched to the wrong engine or a response collected from the wrong rank
would differ); and the shared memory of the TP engine is released at shutdown.

The run with an engine per rank trains with Ulysses sequence parallelism over both workers
(``worker.actor.ulysses_size=2``: one data-parallel group, each packed row split over both ranks; the rollout does not
see it): the actor's log-probs through the all-to-alls equal vLLM's own, and the update moves the weights. One trainer
start-up serves both features."""

from __future__ import annotations

import math
import os

import pytest

from easyrl.testing.worker import InspectableWorker

pytestmark = pytest.mark.e2e

LOGPROB_TOL = 1e-4  # float32 on both sides; measured 1.9e-6 with TP 2 and 1 (as tests/test_e2e_grpo.py)
TP_SHM = ("-[0-1]-cpushm_0", "-[0-1]-cpushm_1")  # the CPU TP all-reduce buffers of a 2-rank group


def _run(e2e_text_config, local_ray, runs_root, tp: int, *overrides: str, weights: bool = False) -> dict:
    """Two steps with ``tensor_parallel_size=tp``; the engines' TP groups, metrics, batches, the ``(world, dp)`` sizes,
    the /dev/shm entries left after shutdown and (``weights``) the actor's weights before and after step 1."""
    import ray

    from easyrl.trainer.__main__ import build_trainer

    def tp_group_ranks(worker) -> list[int]:  # runs inside vLLM's worker (nested: Ray pickles it by value)
        from vllm.distributed.parallel_state import get_tp_group

        return list(get_tp_group().ranks)

    local_ray()  # before the snapshot: a Ray started now adds its own segments
    shm_before = set(os.listdir("/dev/shm"))
    config = e2e_text_config(runs_root, f"worker.rollout.tensor_parallel_size={tp}", "trainer.save_freq=-1",
                             *overrides)
    trainer = build_trainer(config, worker_cls=InspectableWorker if weights else None)
    try:
        groups = ray.get([worker.__ray_call__.remote(lambda w: w.rollout.llm.collective_rpc(tp_group_ranks)[0])
                          for worker in trainer.workers.workers])
        sizes = (trainer.workers.world_size, trainer.workers.dp_size)
        stream = trainer.prompt_stream()
        steps, batches, states = [], [], []
        for step in (1, 2):
            if weights and step == 1:
                states.append(trainer.workers.run_all(InspectableWorker.actor_state_dict)[0])
            trainer.global_step = step
            steps.append(trainer.train_step(stream))
            batches.append(trainer.last_batch)
            if weights and step == 1:
                states.append(trainer.workers.run_all(InspectableWorker.actor_state_dict)[0])
    finally:
        trainer.workers.shutdown()
    # (FSDPWorker.close releases the TP group's shared memory, not left in /dev/shm by the killed workers)
    return {"groups": groups, "steps": steps, "batches": batches, "weights": states, "sizes": sizes,
            "shm_left": set(os.listdir("/dev/shm")) - shm_before}


@pytest.fixture(scope="module")
def tp2(e2e_text_config, local_ray, tmp_path_factory):
    return _run(e2e_text_config, local_ray, tmp_path_factory.mktemp("tp2"), 2)


@pytest.fixture(scope="module")
def tp1_ulysses(e2e_text_config, local_ray, tmp_path_factory):
    return _run(e2e_text_config, local_ray, tmp_path_factory.mktemp("tp1"), 1, "worker.actor.ulysses_size=2",
                weights=True)


def _check_run(run: dict, tp: int) -> None:
    """Finite metrics and vLLM/actor parity after each step's sync; no shared memory left after shutdown."""
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
    """One data-parallel group of 2 ranks; the parity above went through the all-to-alls; the update moved the
    weights."""
    assert tp1_ulysses["sizes"] == (2, 1)
    assert tp1_ulysses["steps"][0]["rollout/log_prob_diff_max"] < LOGPROB_TOL
    assert all(math.isfinite(v) for v in tp1_ulysses["steps"][0].values() if isinstance(v, float))
    before, after = tp1_ulysses["weights"]
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-6
