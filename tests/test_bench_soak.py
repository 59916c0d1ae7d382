"""bench/soak.py's pure parts: the workloads' settings, the slope after warm-up, one sample of a process tree. The
soak itself runs in tests/test_e2e_soak.py (marker e2e: a 20-step demo soak with a bound on the RSS slopes); the
100+ step soaks are run by hand (bench/README.md, "Soak")."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))


def test_slope_is_the_least_squares_line():
    from soak import slope

    assert slope([1, 2, 3, 4], [10.0, 12.0, 14.0, 16.0]) == pytest.approx(2.0)
    assert slope([1, 2, 3], [5.0, 5.0, 5.0]) == 0.0
    assert slope([1], [3.0]) == 0.0


def test_summary_leaves_out_the_warm_up(tmp_path):
    from soak import summarize

    rows = [{"step": s, "elapsed_s": s, "worker0_rss_mb": 1000.0 + (500 if s <= 3 else 0) + 0.5 * s}
            for s in range(1, 21)]
    path = tmp_path / "soak.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarize(str(path), warmup=3)
    assert summary["worker0_rss_mb"]["slope"] == pytest.approx(0.5)  # the warm-up's 500 MB step is not growth
    assert summary["steps"]["first"] == 4 and summary["steps"]["last"] == 20


def test_workloads_load_with_checkpoints_and_validation_on(tmp_path, tiny_model_path):
    from soak import workload_args

    from easyrl.config import load_config

    cfg = load_config(workload_args("demo", 120, str(tmp_path)))
    trainer = cfg.trainer
    assert (trainer.max_steps, trainer.save_freq, trainer.val_freq, trainer.save_limit) == (120, 10, 10, 2)
    assert cfg.trainer.run_dir == os.path.join(str(tmp_path), "soak", "demo") and cfg.world_size == 2
    with pytest.raises(ValueError, match="unknown workload"):
        workload_args("nope", 1, str(tmp_path))


def test_sample_reads_the_driver_and_its_tree(tmp_path):
    from soak import sample

    (tmp_path / "f").write_bytes(b"x" * 2**20)
    row = sample(psutil.Process(), str(tmp_path))
    assert row["driver_rss_mb"] > 10 and row["driver_fds"] > 0 and row["run_dir_mb"] == 1.0


def test_the_soak_validates_on_a_few_rows_and_keeps_each_steps_low_point_and_peak(tmp_path):
    from soak import VAL_ROWS, _merge, val_subset

    demo = val_subset("demo", str(tmp_path / "demo"))
    assert len(os.listdir(demo)) == VAL_ROWS["demo"] and all((Path(demo) / n / "data.json").is_file()
                                                               for n in os.listdir(demo))
    text = val_subset("smollm2", str(tmp_path / "smollm2"))
    assert len(Path(text).read_text().splitlines()) == VAL_ROWS["smollm2"]
    low, peak = {}, {}
    for rss in (3600.0, 3500.0, 4100.0):
        _merge(low, peak, {"worker0_rss_mb": rss, "worker0_fds": 100})
    assert low == {"worker0_rss_mb": 3500.0} and peak == {"worker0_rss_mb": 4100.0}
