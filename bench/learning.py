"""Learning beside TRL: the same GRPO workload through easyrl and through TRL's ``GRPOTrainer``, seed by seed.

The workload is ``examples/configs/smollm2_learn.yaml`` (the ``make demo-learn`` config) plus any ``key=value``
overrides; TRL gets exactly the same settings through ``bench/trl_grpo.py``. Each run is one command (so that a shared
machine can run them one at a time), and ``report`` gathers whatever runs exist:

    python bench/learning.py run --lib easyrl --seed 1      # -> runs/bench/learning/easyrl_seed1/metrics.jsonl
    python bench/learning.py run --lib trl --seed 1         # -> runs/bench/learning/trl_seed1/metrics.jsonl
    python bench/learning.py report                         # -> runs/bench/learning/{learning.png,summary.json}

``report`` plots both libraries' validation accuracy (and reward, response length) on one PNG, one line per seed,
and prints per run: validation accuracy before training and at the end, and the median seconds per step, then a
Markdown table of every run's validation accuracy per step (the one bench/README.md quotes).
A run folder is never overwritten: ``run`` refuses an existing one (delete it, or pass another ``--root``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "examples", "configs", "smollm2_learn.yaml")
LIBS = ("easyrl", "trl")


def run_overrides(lib: str, seed: int, root: str, model_path: str, extra: list[str]) -> list[str]:
    """The config arguments of one run: the demo config, the converted model, the seed (data order, sampling) and
    the run folder ``<root>/<lib>_seed<seed>``, then ``extra`` (later wins)."""
    return [f"config={CONFIG}", f"worker.actor.model.model_path={model_path}", f"data.seed={seed}",
            f"worker.rollout.seed={seed}", f"trainer.runs_root={os.path.dirname(root)}",
            f"trainer.project_name={os.path.basename(root)}", f"trainer.experiment_name={lib}_seed{seed}", *extra]


def run(lib: str, seed: int, root: str, extra: list[str]) -> str:
    """Train one run in a subprocess (its own Ray session or TRL process); returns its ``metrics.jsonl``.

    Raises:
        FileExistsError: the run folder exists.
        subprocess.CalledProcessError: the run failed.
    """
    from easyrl.testing.smollm2 import smollm2_path

    folder = os.path.join(root, f"{lib}_seed{seed}")
    if os.path.exists(folder):
        raise FileExistsError(f"{folder} exists: delete it to run again, or pass another --root")
    train(lib, run_overrides(lib, seed, root, str(smollm2_path()), extra))
    return os.path.join(folder, "metrics.jsonl")


def command_and_env(lib: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one run: ``python -m easyrl.trainer ARGS`` or ``python
    bench/trl_grpo.py ARGS`` (TRL gets all cores as torch threads, as easyrl's one worker with
    ``trainer.cpu_threads_per_worker`` = the core count does)."""
    command = [sys.executable, "-m", "easyrl.trainer", *args] if lib == "easyrl" else \
        [sys.executable, os.path.join(REPO, "bench", "trl_grpo.py"), *args]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)))
    return command, env


def train(lib: str, args: list[str]) -> None:
    """Run :func:`command_and_env` in a subprocess, to completion.

    Raises:
        subprocess.CalledProcessError: the run failed.
    """
    command, env = command_and_env(lib, args)
    subprocess.run(command, check=True, cwd=REPO, env=env)


def summarize(path: str) -> dict:
    """Validation accuracy before training (step 0) and at the last validation, their steps, every validation as
    ``[step, accuracy]`` pairs (``val_accuracy``), and the median ``timing_s/step`` of the run (s)."""
    sys.path.insert(0, os.path.join(REPO, "bench"))
    from plots import read_metrics, series

    rows = read_metrics(path)
    steps, accuracy = series(rows, "val/reward/accuracy")
    _, step_times = series(rows, "timing_s/step")
    return {
        "val_accuracy_start": accuracy[0] if accuracy else float("nan"),
        "val_accuracy_end": accuracy[-1] if accuracy else float("nan"),
        "val_step_start": steps[0] if steps else -1,
        "val_step_end": steps[-1] if steps else -1,
        "val_accuracy": [[step, value] for step, value in zip(steps, accuracy)],
        "steps": max((row["step"] for row in rows), default=0),
        "median_step_s": statistics.median(step_times) if step_times else float("nan"),
    }


def accuracy_table(summary: dict[str, dict]) -> str:
    """A Markdown table of :func:`summarize`'s ``val_accuracy``: one row per run (``summary``'s keys, in order), one
    column per validation step that any run has (``-`` where a run has none), then the median s/step."""
    steps = sorted({step for s in summary.values() for step, _ in s["val_accuracy"]})
    lines = ["| run | " + " | ".join(f"step {step}" for step in steps) + " | s/step (median) |",
             "| --- " * (len(steps) + 2) + "|"]
    for name, s in summary.items():
        by_step = dict(s["val_accuracy"])
        cells = [f"{by_step[step]:.3f}" if step in by_step else "-" for step in steps]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {s['median_step_s']:.1f} |")
    return "\n".join(lines)


def report(root: str) -> dict[str, dict]:
    """Summaries of every ``<root>/<lib>_seed<k>/metrics.jsonl``, written to ``<root>/summary.json`` and plotted to
    ``<root>/learning.png``; prints each run's validation accuracy per step (:func:`accuracy_table`); returns the
    summaries by run name.

    Raises:
        FileNotFoundError: no run under ``root``.
    """
    sys.path.insert(0, os.path.join(REPO, "bench"))
    from plots import plot_runs

    paths = sorted(glob.glob(os.path.join(root, "*_seed*", "metrics.jsonl")))
    if not paths:
        raise FileNotFoundError(f"no {root}/<lib>_seed<k>/metrics.jsonl: run `python bench/learning.py run` first")
    names = [os.path.basename(os.path.dirname(p)) for p in paths]
    summary = {name: summarize(path) for name, path in zip(names, paths)}
    with open(os.path.join(root, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    labels = [name.split("_seed")[0] for name in names]
    plot_runs(paths, os.path.join(root, "learning.png"), labels,
              title="GRPO on SmolLM2-135M-Instruct, single-digit addition: easyrl vs TRL (same settings)")
    for name, s in summary.items():
        print(f"{name:16s} val accuracy {s['val_accuracy_start']:.3f} (step {s['val_step_start']}) -> "
              f"{s['val_accuracy_end']:.3f} (step {s['val_step_end']}), median {s['median_step_s']:.1f} s/step")
    print(accuracy_table(summary))
    return summary


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("run", "report"))
    parser.add_argument("--lib", choices=LIBS, default="easyrl")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--root", default=os.path.join("runs", "bench", "learning"))
    parser.add_argument("overrides", nargs="*", help="config key=value overrides for both libraries")
    args = parser.parse_args(argv)
    if args.action == "run":
        print(run(args.lib, args.seed, args.root, args.overrides))
    else:
        report(args.root)


if __name__ == "__main__":
    main()
