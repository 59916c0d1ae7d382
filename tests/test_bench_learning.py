"""bench/learning.py's summary of a run and its per-step validation-accuracy table, on hand-written metrics files
(no model is run here; test_e2e_bench.py reports on real runs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))


def write_run(folder: Path, rows: list[dict]) -> str:
    folder.mkdir(parents=True)
    path = folder / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_summary_and_table_hold_every_validation(tmp_path):
    from learning import accuracy_table, summarize

    easyrl = write_run(tmp_path / "easyrl_seed1", [
        {"step": 0, "val/reward/accuracy": 0.25},
        {"step": 1, "timing_s/step": 30.0},
        {"step": 2, "timing_s/step": 50.0, "val/reward/accuracy": 0.5},
        {"step": 3, "timing_s/step": 40.0},
        {"step": 4, "timing_s/step": 20.0, "val/reward/accuracy": 0.875},
    ])
    trl = write_run(tmp_path / "trl_seed1", [  # a run cut after step 2: no step-4 validation
        {"step": 0, "val/reward/accuracy": 0.2},
        {"step": 1, "timing_s/step": 100.0},
        {"step": 2, "timing_s/step": 120.0, "val/reward/accuracy": 0.4},
    ])
    summary = {"easyrl_seed1": summarize(easyrl), "trl_seed1": summarize(trl)}
    first = summary["easyrl_seed1"]
    assert first["val_accuracy"] == [[0, 0.25], [2, 0.5], [4, 0.875]]
    assert (first["val_accuracy_start"], first["val_accuracy_end"], first["val_step_end"]) == (0.25, 0.875, 4)
    assert (first["steps"], first["median_step_s"]) == (4, 35.0)
    assert json.loads(json.dumps(summary)) == summary  # summary.json reads back equal
    assert accuracy_table(summary).splitlines() == [
        "| run | step 0 | step 2 | step 4 | s/step (median) |",
        "| --- | --- | --- | --- | --- |",
        "| easyrl_seed1 | 0.250 | 0.500 | 0.875 | 35.0 |",
        "| trl_seed1 | 0.200 | 0.400 | - | 110.0 |",
    ]
