"""bench/step_speed.py's pure parts: the workload's settings, step summaries, ratios, the RSS watcher (no model is
run here; tests/test_e2e_bench.py runs the benchmark at its smallest size)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))


def test_the_workload_is_the_issue_s():
    from step_speed import overrides

    from easyrl.config import load_config

    cfg = load_config(overrides("easyrl", "/tmp/x/speed", "unused", 5, 2, ["worker.rollout.n=8"]))
    assert (cfg.data.rollout_batch_size, cfg.worker.rollout.n, cfg.data.max_response_length) == (8, 8, 64)
    assert (cfg.algorithm.kl_coef, cfg.algorithm.kl_penalty, cfg.worker.actor.optim.lr) == (0.04, "low_var_kl", 1e-5)
    assert (cfg.worker.actor.fsdp.param_dtype, cfg.worker.rollout.dtype) == ("fp32", "fp32")
    assert cfg.on_policy_update  # one optimizer step per rollout batch
    assert cfg.worker.actor.micro_batch_size_per_device_for_update == 32  # one forward/backward, as TRL's batch
    assert (cfg.trainer.max_steps, cfg.trainer.val_freq, cfg.trainer.val_before_train) == (5, -1, False)
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.cpu_threads_per_worker) == (1, 2)
    assert cfg.trainer.run_dir == "/tmp/x/speed/easyrl"


def test_summarize_takes_medians_after_the_first_step(tmp_path):
    from step_speed import summarize

    path = tmp_path / "metrics.jsonl"
    steps = [(100.0, 50.0, 1000.0), (10.0, 4.0, 500.0), (20.0, 6.0, 800.0), (12.0, 3.0, 600.0)]
    path.write_text("".join(json.dumps({"step": i + 1, "timing_s/step": s, "timing_s/gen": g, "timing_s/reshard": 0.5,
                                        "perf/total_num_tokens": t, "perf/padding_fraction": 0.25,
                                        "rollout/probs_diff_mean": 1e-3 * (i + 1),
                                        "rollout/log_prob_diff_max": 0.1 * (4 - i)}) + "\n"
                            for i, (s, g, t) in enumerate(steps)))
    out = summarize(str(path))
    assert (out["steps"], out["median_step_s"], out["tokens_per_step"]) == (4, 12.0, 600.0)
    assert out["tokens_per_s"] == 50.0  # median of 50, 40, 50
    assert out["share/gen"] == 0.3  # median of 0.4, 0.3, 0.25
    assert (out["share/update_actor"], out["weight_sync_s"], out["padding_fraction"]) == (0.0, 0.5, 0.25)
    # the dtype's exactness: medians over every step, the first included
    assert out["rollout/probs_diff_mean"] == pytest.approx(2.5e-3) and out["rollout/log_prob_diff_max"] == 0.25


def test_ratios_are_of_throughput_and_step_time():
    from step_speed import ratios, table

    phases = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")
    summary = {"easyrl": {"median_step_s": 10.0, "tokens_per_s": 300.0, "tokens_per_step": 3000.0,
                          "rollout/probs_diff_mean": 2e-4, "rollout/log_prob_diff_max": 0.31, "weight_sync_s": 0.5, "padding_fraction": 0.4, "rss_gb": {"ray::FSDPWorker#0": 3.5},
                          **{f"share/{p}": 0.1 for p in phases}},
               "trl": {"median_step_s": 20.0, "tokens_per_s": 100.0, "rss_gb": {"main": 9.0}},
               "floor": {"step_s": 8.0, "tokens_per_s": 330.0, "tokens_per_step": 2640.0, "gen_s": 4.0,
                         "forward_s": 1.0, "train_step_s": 2.9, "weight_copy_s": 0.1, "weight_bytes": 5e8,
                         "rss_gb": {"main": 4.0}}}
    assert ratios(summary) == pytest.approx({"easyrl/TRL throughput": 3.0, "TRL/easyrl s/step": 2.0,
                                             "floor/easyrl throughput": 1.1, "easyrl/floor s/step": 1.25,
                                             "weight sync / plain copy": 5.0})
    assert ratios({"easyrl": summary["easyrl"]}) == {}
    summary["ratios"] = ratios(summary)
    text = table(summary)
    assert "| easyrl | 10.00 | 3000 | 300.0 |" in text and "ray::FSDPWorker#0 3.5" in text
    assert "vLLM/actor gap: mean prob 2.0e-04, max log-prob 0.31" in text
    assert "| TRL GRPOTrainer | 20.00 |" in text and "| bare floor | 8.00 | 2640 | 330.0 |" in text
    assert "easyrl/TRL throughput = 3.00" in text


def test_run_watched_reports_the_peak_rss_and_failures():
    from step_speed import run_watched

    hold = "import time; b = bytearray(400 * 1000 * 1000); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.5)"
    peaks = run_watched([sys.executable, "-c", hold], {}, interval=0.05)
    assert list(peaks) == ["main"] and 0.4 < peaks["main"] < 1.0
    with pytest.raises(subprocess.CalledProcessError):
        run_watched([sys.executable, "-c", "raise SystemExit(3)"], {})


@pytest.mark.parametrize("argv", [
    ["--libs", "easyrl", "floor", "--root", "/r", "a.b=1", "c=2"],
    ["run", "--libs", "easyrl", "floor", "--root", "/r", "a.b=1", "c=2"],
    ["a.b=1", "c=2", "--libs", "easyrl", "floor", "--root", "/r"],
])
def test_command_line_overrides_after_the_options(monkeypatch, argv):
    import step_speed

    calls = []
    monkeypatch.setattr(step_speed, "run", lambda *args: calls.append(args))
    step_speed.main(argv)
    assert calls == [("/r", 4, 3, ["easyrl", "floor"], ["a.b=1", "c=2"], None)]
