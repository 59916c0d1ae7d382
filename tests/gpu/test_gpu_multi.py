"""The multi-GPU check (``make gpu-check-multi``, issue #48), for a machine of two or more CUDA GPUs with vLLM (a
CUDA build) and Ray installed: the tiny text model, bf16, the collective contract on (``trainer.check_collectives``:
every collective's kind, shape and order compared across ranks before it runs), two GRPO steps each:

- colocated with one vLLM engine over both GPUs (``worker.rollout.tensor_parallel_size=2``), the fail-closed
  weight-sync check on (``worker.actor.rollout_sync_threshold``: the run stops when vLLM's log-probs of the sampled
  tokens stray from the actor's);
- ``one_step_off`` on one trainer GPU and one rollout GPU, the weights crossing by NCCL broadcast in several buckets
  (``easyrl.workers.weight_transfer``).

A pass says tensor-parallel rollout, the split transfer and the contract hold on NCCL; not that a real model learns
or fits (``make gpu-check``, ``easyrl simulate``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

GPU = ("trainer.device=cuda", "trainer.max_steps=2", "trainer.val_freq=-1", "trainer.save_freq=-1",
       "trainer.check_collectives=true", "worker.actor.fsdp.param_dtype=bf16", "worker.rollout.dtype=bf16",
       "worker.rollout.gpu_memory_utilization=0.3", "worker.rollout.enforce_eager=true")


def _two_steps(config) -> list[dict]:
    """``config``'s run through ``trainer.fit()`` in a Ray session of its own; its ``metrics.jsonl`` rows."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("vllm")
    from easyrl.trainer.__main__ import build_trainer

    ray.init(include_dashboard=False)
    try:
        trainer = build_trainer(config)
        trainer.fit()
        trainer.close()
        lines = (Path(config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()
    finally:
        ray.shutdown()
    rows = [json.loads(line) for line in lines]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(math.isfinite(row["actor/pg_loss"]) for row in rows)
    return rows


def test_tensor_parallel_rollout_on_two_gpus(e2e_text_config, tmp_path):
    rows = _two_steps(e2e_text_config(tmp_path, *GPU, "trainer.n_gpus_per_node=2",
                                      "worker.rollout.tensor_parallel_size=2"))
    assert all(row["rollout/log_prob_diff_max"] < 0.1 for row in rows)  # bf16 engine vs bf16 actor, same weights


def test_one_step_off_sends_the_weights_by_nccl(e2e_text_config, tmp_path):
    rows = _two_steps(e2e_text_config(tmp_path, *GPU, "trainer.rollout_mode=one_step_off", "trainer.n_gpus_per_node=1",
                                      "worker.rollout.n_gpus_per_node=1", "algorithm.use_kl_loss=false",
                                      "worker.rollout.update_weights_bucket_megabytes=1"))
    assert [row["async/staleness_max"] for row in rows] == [0, 1]
    assert all(row["timing_s/weight_transfer"] > 0 for row in rows[1:])
