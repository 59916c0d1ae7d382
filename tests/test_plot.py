"""``easyrl plot`` on synthetic metrics.jsonl files: the panels, the lines' data, several runs, the files written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from easyrl.cli import main as easyrl_main
from easyrl.errors import RunStateError
from easyrl.plot import MIN_RELATIVE_SPAN, PANELS, plot_runs, read_run, y_limits


def _write_run(folder: Path, reward_slope: float, steps: int = 4) -> Path:
    folder.mkdir(parents=True)
    rows = []
    for step in range(1, steps + 1):
        rows.append({
            "step": step, "critic/score/mean": reward_slope * step, "reward/accuracy": 0.1 * step,
            "response_length/mean": 30.0 + step, "response_length/clip_ratio": 0.25, "actor/kl_loss": 0.001 * step,
            "actor/entropy": 11.8799525 + 1e-7 * (step % 2), "actor/pg_clipfrac": 0.01,
            "actor/grad_norm": "nan" if step == 2 else 1.5, "timing_s/gen": 10.0, "timing_s/update_actor": 5.0,
            "timing_s/step": 20.0, "perf/throughput": 100.0 + step, "perf/throughput_total": 200.0 + 2 * step,
            "reward/frac_reward_zero_std": 0.5,
        })
    rows[-1]["val/reward/overall"] = 0.42
    rows[-1]["val/reward/accuracy"] = 0.5
    rows[-1]["val/generations"] = [{"prompt": "p", "response": "r", "ground_truth": "g", "score": 1.0}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _panels(fig) -> dict[str, object]:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def _labels(ax) -> set[str]:
    return {line.get_label() for line in ax.lines}


def test_panels_and_lines_from_two_runs(tmp_path):
    a = _write_run(tmp_path / "runs/p/grpo", reward_slope=0.1)
    b = _write_run(tmp_path / "runs/p/dapo", reward_slope=0.2)
    runs = [read_run(str(a)), read_run(str(b))]
    assert runs[0].series["actor/grad_norm"][1][1] != runs[0].series["actor/grad_norm"][1][1]  # "nan" -> float nan
    assert "val/generations" not in runs[0].series
    fig = plot_runs(runs, str(tmp_path / "out/metrics.png"))
    panels = _panels(fig)
    logged = ["reward", "accuracy", "groups without reward spread", "response length", "responses cut at max length",
              "KL", "entropy", "PPO clip fraction", "grad norm", "phase timings", "throughput per device",
              "throughput, all devices"]
    assert list(panels) == logged == [panel.title for panel in PANELS if panel.title in logged]
    assert fig.texts[-1].get_text() == ("not logged: multi-turn, tool-turn tokens, LLM judge, reward model, MFU, "
                                        "memory")  # panels no run logged are left out, and named

    lines = {line.get_label(): line for line in panels["reward"].lines}  # legends: the metrics.jsonl keys
    assert set(lines) == {f"{run}: {key}" for run in ("grpo", "dapo") for key in ("critic/score/mean",
                                                                                  "val/reward/overall")}
    assert list(lines["dapo: critic/score/mean"].get_ydata()) == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert list(lines["grpo: critic/score/mean"].get_xdata()) == [1, 2, 3, 4]
    assert lines["grpo: critic/score/mean"].get_linestyle() == "-"
    assert lines["dapo: critic/score/mean"].get_linestyle() == "--"
    assert list(lines["grpo: val/reward/overall"].get_xdata()) == [4]
    legend = [text.get_text() for text in panels["reward"].get_legend().get_texts()]
    assert legend == ["critic/score/mean", "val/reward/overall", "grpo", "dapo"]  # metrics once, then the runs
    assert _labels(panels["accuracy"]) == {f"{run}: {key}" for run in ("grpo", "dapo")
                                           for key in ("reward/accuracy", "val/reward/accuracy")}
    # truncation has its own panel, not the PPO clip fraction's; per-device and total throughput separate axes
    assert _labels(panels["PPO clip fraction"]) == {"grpo: actor/pg_clipfrac", "dapo: actor/pg_clipfrac"}
    assert _labels(panels["responses cut at max length"]) == {f"{run}: response_length/clip_ratio"
                                                              for run in ("grpo", "dapo")}
    assert _labels(panels["throughput per device"]) == {f"{run}: perf/throughput" for run in ("grpo", "dapo")}
    assert _labels(panels["throughput, all devices"]) == {f"{run}: perf/throughput_total" for run in ("grpo", "dapo")}
    assert _labels(panels["phase timings"]) == {f"{run}: timing_s/{phase}" for run in ("grpo", "dapo")
                                                for phase in ("gen", "update_actor", "step")}
    # one colour per metric in a panel, the same in every run
    timing = {line.get_label(): line.get_color() for line in panels["phase timings"].lines}
    assert timing["grpo: timing_s/gen"] == timing["dapo: timing_s/gen"] != timing["grpo: timing_s/step"]
    png = (tmp_path / "out/metrics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    html = (tmp_path / "out/metrics.html").read_text()
    assert "data:image/png;base64," in html and "<td>critic/score/mean</td><td>0.4</td><td>0.8</td>" in html


def test_a_flat_series_is_drawn_flat_with_plain_ticks(tmp_path):
    fig = plot_runs([read_run(str(_write_run(tmp_path / "run", reward_slope=0.1)))], str(tmp_path / "m.png"))
    panels = _panels(fig)
    entropy = panels["entropy"]  # 11.8799525 and 11.8799526: a change of 1e-8 relative
    bottom, top = entropy.get_ylim()
    assert top - bottom == pytest.approx(MIN_RELATIVE_SPAN * 11.8799526) and bottom < 11.8799525 < top
    fig.canvas.draw()
    ticks = [label.get_text() for label in entropy.get_yticklabels() if label.get_text()]
    assert ticks and all(len(tick.replace("\u2212", "-")) <= 5 for tick in ticks), ticks  # "11.8", not 11.8799525
    assert entropy.yaxis.get_major_formatter().get_useOffset() is False
    assert entropy.yaxis.get_offset_text().get_text() == ""
    assert panels["reward"].get_ylim()[1] - panels["reward"].get_ylim()[0] < 1  # a moving series keeps autoscale


def test_y_limits():
    assert y_limits([0.0, 0.0], fraction=True) == (0.0, 1.0)  # an all-zero fraction: the whole [0, 1]
    assert y_limits([1.0, 1.0], fraction=True) == pytest.approx((0.95, 1.0))  # capped at 1
    assert y_limits([20.0, 20.0]) == pytest.approx((19.5, 20.5))
    assert y_limits([0.01, 0.0101]) == pytest.approx((0.0097975, 0.0103025))
    assert y_limits([0.0, 0.0]) == (0.0, 1.0)  # all >= 0: moved up to start at 0 rather than (-0.5, 0.5)
    assert y_limits([-3.0, -3.0001]) == pytest.approx((-3.07505, -2.92505))
    assert y_limits([0.8, 0.9]) is None and y_limits([float("nan")]) is None and y_limits([]) is None


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
    with pytest.raises(RunStateError, match=r"metrics.jsonl:2 is not a JSON object"):
        read_run(str(tmp_path))


def test_multi_turn_judge_and_reward_model_panels_come_from_the_logged_names(tmp_path):
    run = _write_run(tmp_path / "agent", reward_slope=0.1, steps=2)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.update({"timing_s/judge": 37.0, "timing_s/reward_model": 2.0, "judge/unparseable": 9.0,
                    "reward/judge": 0.4, "reward_model/truncated": 0.0, "reward/reward_model": 1.5,
                    "multi_turn/tool_calls": 12.0, "multi_turn/tool_errors": 1.0,
                    "multi_turn/assistant_turns/mean": 2.0, "multi_turn/assistant_turns/max": 3.0,
                    "multi_turn/masked_token_share": 0.3})
    rows[0]["timing_s/startup/ray"] = 12.0  # a start-up profile's parts: not a phase of every step
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    panels = _panels(plot_runs([read_run(str(run))], str(tmp_path / "m.png")))
    assert _labels(panels["phase timings"]) == {f"timing_s/{phase}" for phase in
                                                ("gen", "update_actor", "step", "judge", "reward_model")}
    assert _labels(panels["multi-turn"]) == {"multi_turn/tool_calls", "multi_turn/tool_errors",
                                             "multi_turn/assistant_turns/mean"}
    assert _labels(panels["tool-turn tokens"]) == {"multi_turn/masked_token_share"}
    assert _labels(panels["LLM judge"]) == {"reward/judge", "judge/unparseable"}
    assert _labels(panels["reward model"]) == {"reward/reward_model", "reward_model/truncated"}
