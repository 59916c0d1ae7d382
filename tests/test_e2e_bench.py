"""The benchmarks under bench/ at their smallest size, for real, with the tiny random-weight Qwen2.5 instead of
SmolLM2 (seconds instead of minutes): one ``bench/step_speed.py`` run trains 2 steps through easyrl (Ray + vLLM +
FSDP2) and TRL's GRPOTrainer, with validation, and measures the bare floor (vLLM generate, HF forward/backward);
``bench/learning.py`` and ``bench/scaling.py`` then report on those same runs (their ``run`` commands differ from
these only in the overrides, which tests/test_bench_trl.py and tests/test_bench_step_speed.py check). No timing or
learning assertions: bench/README.md holds the measured numbers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

# under `make test-slow` (three libraries' start-up; no assertion on the pipeline itself: the suite's time, docs/development.md)
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 2


@pytest.fixture(scope="module")
def speed(tmp_path_factory, tiny_model_path) -> tuple[Path, dict]:
    """One step_speed run of all three at the smallest size: 2 prompts x 2 samples, 8 new tokens, 2 steps,
    validation before training and after each step on 2 held-out prompts."""
    import step_speed

    tmp = tmp_path_factory.mktemp("bench")
    val = tmp / "val.jsonl"
    val.write_text("\n".join((REPO / "examples/data/digit_addition/val.jsonl").read_text().splitlines()[:2]) + "\n")
    smallest = ["data.rollout_batch_size=2", "worker.actor.global_batch_size=2", "worker.rollout.n=2",
                "worker.actor.micro_batch_size_per_device_for_update=4",
                "worker.actor.micro_batch_size_per_device_for_experience=4", "data.max_response_length=8", f"data.val_files={val}", "worker.rollout.val_override_config.n=1",
                "trainer.val_freq=1", "trainer.val_before_train=true"]
    root = tmp / "step_speed"
    summary = step_speed.run(str(root), STEPS, 1, ["easyrl", "trl", "floor"], smallest,
                             str(tiny_model_path("qwen2_5")))
    return root, summary


def test_step_speed_runs_easyrl_trl_and_the_floor(speed):
    import step_speed

    root, summary = speed
    easyrl, trl, floor = summary["easyrl"], summary["trl"], summary["floor"]
    for run in (easyrl, trl):
        assert run["steps"] == STEPS and run["median_step_s"] > 0 and run["tokens_per_s"] > 0
        # 2 x 2 samples of a prompt (chat template + question) and at most 8 response tokens
        assert 4 * 10 < run["tokens_per_step"] <= 4 * (64 + 8)
    assert 0 < easyrl["share/gen"] < 1 and 0 < easyrl["share/update_actor"] < 1
    assert easyrl["share/old_log_prob"] == 0  # one update per rollout batch: on-policy, no old-log-prob pass
    assert 0 < easyrl["padding_fraction"] < 1
    assert set(easyrl["rss_gb"]) >= {"main", "ray::FSDPWorker#0"} and "ray::FSDPWorker#1" not in easyrl["rss_gb"]
    assert min(easyrl["rss_gb"]["ray::FSDPWorker#0"], trl["rss_gb"]["main"], floor["rss_gb"]["main"]) > 0.2
    assert min(floor[k] for k in ("gen_s", "forward_s", "train_step_s", "weight_copy_s")) > 0
    # the tiny Qwen2.5's parameters in fp32: the 151936 x 256 embedding (tied: counted once) and 2 small layers
    assert 151936 * 256 * 4 < floor["weight_bytes"] < 151936 * 256 * 4 + 8e6
    assert floor["step_s"] == pytest.approx(floor["gen_s"] + floor["forward_s"] + floor["train_step_s"]
                                            + floor["weight_copy_s"])
    assert summary["ratios"] == step_speed.ratios(summary) and len(summary["ratios"]) == 5
    assert json.loads((root / "summary.json").read_text()) == summary
    table = (root / "table.md").read_text()
    assert "| easyrl |" in table and "| TRL GRPOTrainer |" in table and "| bare floor |" in table
    with pytest.raises(FileExistsError, match="step_speed exists"):
        step_speed.run(str(root), STEPS, 1, ["floor"], [], "unused")


def test_learning_report_plots_both_libraries(speed, tmp_path):
    import learning

    root, _ = speed
    for lib in learning.LIBS:
        os.symlink(root / lib, tmp_path / f"{lib}_seed1")
    summary = learning.report(str(tmp_path))
    assert sorted(summary) == ["easyrl_seed1", "trl_seed1"]
    for name, s in summary.items():
        assert (s["steps"], s["val_step_start"], s["val_step_end"]) == (STEPS, 0, STEPS), name
        assert 0.0 <= s["val_accuracy_start"] <= 1.0 and 0.0 <= s["val_accuracy_end"] <= 1.0, name
    assert (tmp_path / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_scaling_report_reads_an_easyrl_run(speed, tmp_path):
    import scaling

    root, summary = speed
    os.symlink(root / "easyrl", tmp_path / "b2_w1t2")
    point = scaling.report(str(tmp_path))["b2_w1t2"]
    assert point["steps"] == STEPS and point["median_step_s"] == summary["easyrl"]["median_step_s"]
    assert point["tokens_per_s"] == pytest.approx(summary["easyrl"]["tokens_per_s"])
