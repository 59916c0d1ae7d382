"""``easyrl plot`` on synthetic metrics.jsonl files: the panels, the lines' data, several runs, the files written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from easyrl.cli import main as easyrl_main
from easyrl.plot import PANELS, plot_runs, read_run


def _write_run(folder: Path, reward_slope: float, steps: int = 4) -> Path:
    folder.mkdir(parents=True)
    rows = []
    for step in range(1, steps + 1):
        rows.append({
            "step": step, "critic/score/mean": reward_slope * step, "reward/accuracy": 0.1 * step,
            "response_length/mean": 30.0 + step, "actor/kl_loss": 0.001 * step, "actor/entropy": 2.0 - 0.1 * step,
            "actor/pg_clipfrac": 0.01, "actor/grad_norm": "nan" if step == 2 else 1.5, "timing_s/gen": 10.0,
            "timing_s/update_actor": 5.0, "timing_s/step": 20.0, "perf/throughput": 100.0 + step,
            "reward/frac_reward_zero_std": 0.5,
        })
    rows[-1]["val/reward/overall"] = 0.42
    rows[-1]["val/generations"] = [{"prompt": "p", "response": "r", "ground_truth": "g", "score": 1.0}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_panels_and_lines_from_two_runs(tmp_path):
    a = _write_run(tmp_path / "runs/p/grpo", reward_slope=0.1)
    b = _write_run(tmp_path / "runs/p/dapo", reward_slope=0.2)
    runs = [read_run(str(a)), read_run(str(b))]
    assert runs[0].series["actor/grad_norm"][1][1] != runs[0].series["actor/grad_norm"][1][1]  # "nan" -> float nan
    assert "val/generations" not in runs[0].series
    fig = plot_runs(runs, str(tmp_path / "out/metrics.png"))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [title for title, _, _ in PANELS]
    reward_ax = fig.axes[0]
    lines = {line.get_label(): line for line in reward_ax.lines}
    assert list(lines["dapo: reward"].get_ydata()) == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert list(lines["grpo: reward"].get_xdata()) == [1, 2, 3, 4]
    assert lines["grpo: reward"].get_linestyle() == "-" and lines["dapo: reward"].get_linestyle() == "--"
    assert list(lines["grpo: val reward"].get_xdata()) == [4]
    timing_labels = {line.get_label() for line in fig.axes[6].lines}
    assert timing_labels == {f"{run}: {phase}" for run in ("grpo", "dapo") for phase in ("gen", "update actor", "step")}
    assert fig.axes[8].texts[0].get_text() == "not logged"  # no memory metrics in these runs
    png = (tmp_path / "out/metrics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    html = (tmp_path / "out/metrics.html").read_text()
    assert "data:image/png;base64," in html and "<td>critic/score/mean</td><td>0.4</td><td>0.8</td>" in html


def test_console_script_and_module_entry_points(tmp_path, capsys):
    run = _write_run(tmp_path / "run", reward_slope=0.1)
    assert easyrl_main(["plot", str(run)]) == 0
    assert (run / "plots/metrics.png").exists() and (run / "plots/metrics.html").exists()
    assert capsys.readouterr().out.splitlines() == [str(run / "plots/metrics.png"), str(run / "plots/metrics.html")]
    assert easyrl_main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "nowhere/metrics.jsonl does not exist" in capsys.readouterr().err
    out = tmp_path / "cmp.png"
    done = subprocess.run([sys.executable, "-m", "easyrl.plot", str(run / "metrics.jsonl"), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.exists() and (tmp_path / "cmp.html").exists()


def test_bad_line_names_file_and_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "a": 1.0}\nnot json\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a JSON object"):
        read_run(str(tmp_path))
