"""Two GRPO steps of the tiny Qwen2.5-VL on one GPU with vLLM sleep mode (level 2) on, where vLLM (a CUDA build) and
Ray are installed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_two_grpo_steps_with_sleep_mode(e2e_config, tmp_path):
    pytest.importorskip("vllm")
    ray = pytest.importorskip("ray")
    from easyrl.trainer.__main__ import build_trainer

    config = e2e_config(
        "qwen2_5_vl", tmp_path / "runs", "trainer.device=cuda", "trainer.n_gpus_per_node=1", "trainer.max_steps=2",
        "trainer.val_freq=-1", "worker.actor.fsdp.param_dtype=bf16", "worker.rollout.dtype=bf16",
        "worker.rollout.gpu_memory_utilization=0.3", "worker.rollout.enforce_eager=true",
    )
    ray.init(include_dashboard=False)
    try:
        trainer = build_trainer(config)
        (worker,) = trainer.workers.workers
        assert ray.get(worker.__ray_call__.remote(lambda w: w.rollout.sleep_level)) == 2
        trainer.fit()
        trainer.close()
        lines = (Path(trainer.config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        assert [r["step"] for r in rows] == [1, 2]
        assert all(math.isfinite(r["actor/pg_loss"]) and r["timing_s/reshard"] > 0 for r in rows)
    finally:
        ray.shutdown()
