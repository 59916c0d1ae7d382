"""Scaling on this machine: easyrl's step time as the rollout batch doubles, and 1 worker x 2 threads vs 2 workers x
1 thread, on the learning workload (``examples/configs/smollm2_learn.yaml``: SmolLM2-135M-Instruct, GRPO) without
validation. Each point is one command (one Ray session), ``report`` gathers whatever points exist:

    python bench/scaling.py run --point b4_w1t2       # rollout batch 4 prompts, 1 worker x 2 threads
    python bench/scaling.py run --point b8_w2t1       # rollout batch 8 prompts, 2 workers x 1 thread
    python bench/scaling.py report                    # -> runs/bench/scaling/summary.json, a Markdown table

A point ``b<B>_w<W>t<T>`` trains ``--steps`` steps (default 3) with ``data.rollout_batch_size=B`` (one optimizer step
per batch), ``trainer.n_gpus_per_node=W`` and ``trainer.cpu_threads_per_worker=T``; its step time is the median of
``timing_s/step`` over the steps after the first (which includes warm-up), with each phase's share.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning import CONFIG, train  # noqa: E402
from plots import read_metrics  # noqa: E402

POINT = re.compile(r"b(\d+)_w(\d+)t(\d+)")
DEFAULT_POINTS = ("b4_w1t2", "b8_w1t2", "b16_w1t2", "b8_w2t1")
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")


def point_overrides(point: str, root: str, model_path: str, steps: int, extra: list[str]) -> list[str]:
    """The config arguments of one point (see the module docstring), then ``extra`` (later wins).

    Raises:
        ValueError: ``point`` is not ``b<B>_w<W>t<T>``.
    """
    match = POINT.fullmatch(point)
    if not match:
        raise ValueError(f"point {point!r} is not b<batch>_w<workers>t<threads>, e.g. b8_w1t2")
    batch, workers, threads = (int(g) for g in match.groups())
    return [f"config={CONFIG}", f"worker.actor.model.model_path={model_path}", f"data.rollout_batch_size={batch}",
            f"worker.actor.global_batch_size={batch}", f"trainer.n_gpus_per_node={workers}",
            f"trainer.cpu_threads_per_worker={threads}", f"trainer.max_steps={steps}", "trainer.val_freq=-1",
            "trainer.val_before_train=false", f"trainer.runs_root={os.path.dirname(root)}",
            f"trainer.project_name={os.path.basename(root)}", f"trainer.experiment_name={point}", *extra]


def summarize(path: str) -> dict[str, float]:
    """Median step time (s) after the first step, samples per step, tokens/s and each phase's share of the step."""
    rows = [row for row in read_metrics(path) if "timing_s/step" in row]
    timed = rows[1:] or rows
    step = statistics.median(row["timing_s/step"] for row in timed)
    out = {"steps": len(rows), "median_step_s": step}
    for phase in PHASES:
        values = [row.get(f"timing_s/{phase}", 0.0) / row["timing_s/step"] for row in timed]
        out[f"share/{phase}"] = statistics.median(values)
    if "perf/total_num_tokens" in timed[0]:
        out["tokens_per_s"] = statistics.median(row["perf/total_num_tokens"] / row["timing_s/step"] for row in timed)
    return out


def report(root: str) -> dict[str, dict[str, float]]:
    """Summaries of every ``<root>/<point>/metrics.jsonl`` to ``<root>/summary.json``; prints a Markdown table.

    Raises:
        FileNotFoundError: no point under ``root``.
    """
    paths = sorted(p for p in glob.glob(os.path.join(root, "*", "metrics.jsonl"))
                   if POINT.fullmatch(os.path.basename(os.path.dirname(p))))
    if not paths:
        raise FileNotFoundError(f"no {root}/<point>/metrics.jsonl: run `python bench/scaling.py run` first")
    summary = {os.path.basename(os.path.dirname(p)): summarize(p) for p in paths}
    with open(os.path.join(root, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    print("| point | prompts x n | workers x threads | s/step (median) | tokens/s | gen | old | ref | update |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, s in sorted(summary.items(), key=lambda kv: tuple(int(g) for g in POINT.fullmatch(kv[0]).groups())):
        batch, workers, threads = POINT.fullmatch(name).groups()
        print(f"| {name} | {batch} | {workers} x {threads} | {s['median_step_s']:.1f} | {s.get('tokens_per_s', 0):.0f} "
              f"| {s['share/gen']:.0%} | {s['share/old_log_prob']:.0%} | {s['share/ref']:.0%} "
              f"| {s['share/update_actor']:.0%} |")
    return summary


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("run", "report"))
    parser.add_argument("--point", action="append", help=f"repeatable; default: {' '.join(DEFAULT_POINTS)}")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--root", default=os.path.join("runs", "bench", "scaling"))
    parser.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = parser.parse_args(argv)
    if args.action == "report":
        report(args.root)
        return
    from easyrl.testing.smollm2 import smollm2_path

    for point in args.point or DEFAULT_POINTS:
        folder = os.path.join(args.root, point)
        if os.path.exists(folder):
            raise FileExistsError(f"{folder} exists: delete it to run again, or pass another --root")
        train("easyrl", point_overrides(point, args.root, str(smollm2_path()), args.steps, args.overrides))


if __name__ == "__main__":
    main()
