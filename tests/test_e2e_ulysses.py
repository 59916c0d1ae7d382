"""End to end on the CPU: one GRPO step with Ulysses sequence parallelism over the 2 Ray workers
(``worker.actor.ulysses_size=2``: one data-parallel group, each packed row split over both ranks) on the tiny text
Qwen2.5; the actor's log-probs through the all-to-alls equal vLLM's own (fp32). Costs one trainer start-up and a
step (~70 s on 2 cores)."""

from __future__ import annotations

import math

import pytest

from easyrl.testing.worker import InspectableWorker

pytestmark = pytest.mark.e2e

LOGPROB_TOL = 1e-4  # as tests/test_e2e_grpo.py: fp32 vLLM vs the fp32 FSDP2 actor measured ~2e-6 apart


def test_grpo_step_with_ulysses_over_two_workers(local_ray, e2e_text_config, tmp_path):
    from easyrl.trainer.__main__ import build_trainer

    local_ray()
    config = e2e_text_config(tmp_path / "runs", "worker.actor.ulysses_size=2", "trainer.max_steps=1")
    trainer = build_trainer(config, worker_cls=InspectableWorker)
    try:
        assert (trainer.workers.world_size, trainer.workers.dp_size) == (2, 1)
        before = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
        metrics = trainer.train_step(iter(trainer.train_dataloader))
        after = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
    finally:
        trainer.workers.shutdown()
    assert metrics["rollout/log_prob_diff_max"] < LOGPROB_TOL, metrics["rollout/log_prob_diff_max"]
    assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-6  # the update moved the weights
