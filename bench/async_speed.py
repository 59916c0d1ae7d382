"""Rollout while training (issue #38): one long-tail GRPO workload in ``trainer.rollout_mode`` = ``colocated``,
``one_step_off`` and ``async`` at equal total cores, one after the other in one command, with the ratios.

    flock /tmp/easyrl-e2e.lock .venv/bin/python bench/async_speed.py          # all three modes, 3 steps each
    flock /tmp/easyrl-e2e.lock .venv/bin/python bench/async_speed.py --modes colocated one_step_off --steps 2 \\
        --root /tmp/a data.max_response_length=32                             # smallest
    .venv/bin/python bench/async_speed.py --report --root runs/bench/async_speed   # the table again, from the runs

The workload: SmolLM2-135M-Instruct (fp32), GRPO on the demo's single-digit addition prompts graded by the last
integer (``examples/configs/smollm2_learn.yaml``), 4 prompts x 4 samples a step, temperature 1, up to 128 new tokens,
no KL loss (no reference model), no validation. The untrained model's natural answer lengths are the long tail:
most responses are a sentence (median ~22 tokens), a few ramble to the cap (probed with vLLM, 64 samples up to 256
tokens: 12% reached 128 tokens, 9% 256). Nothing sets the lengths: the tail is the model's own, and it shrinks as
GRPO learns to answer shortly (the learning curve beside the speed says how much). ``async`` starts a chunk of one
prompt group (``data.mini_rollout_batch_size``) whenever a decode slot is free, its engine driven request by request
with the weights sent in flight; the trained batch is the same in every mode.

Equal total cores (this machine's 2): ``colocated`` runs 1 worker x 2 threads (the learning config's layout, 9%
faster than 2 x 1 in ``bench/scaling.py``, and half the RAM), the split modes 1 trainer worker (FSDP2) + 1 rollout
worker (vLLM) x 1 thread each (``trainer.cpu_threads_per_worker=1``). ``async`` trains samples up to
``trainer.max_staleness`` = 2 weight versions old.

Per mode (steady state = the steps after the first, which holds the engines' first generation with nothing to
overlap): s/step, tokens/s (prompt + response tokens trained per second; steady and whole-run = all tokens over all
step seconds), each side's tokens/s (rollout: response tokens per generation second; train: tokens per busy
training second), each side's idle share of the run (colocated: the trainer side idles while generating and the
engine side while training), the engines' decode-slot occupancy (``rollout/slot_occupancy``: the share of a step's
worth of decode slots, ``rollout_batch_size x n`` per engine, that held a sequence over the engine's steps), the
tail share of generation (``1 - mean / max`` response length: decode slots a
batch leaves empty while its longest responses finish), the time the overlap could at best save
(``min(gen, train) / (gen + train)`` of the colocated step) and reward and response length per step. Ratios are
against ``colocated``. :func:`model_speedups` is the analytic model of bench/README.md. A run folder is never
overwritten (``--root`` must not hold the mode); each run's checkpoint and exported model are deleted after it
(only ``metrics.jsonl`` is kept). Results: ``<root>/summary.json`` and ``--results`` (``.json`` + ``.md``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning import CONFIG, REPO, train  # noqa: E402
from plots import read_metrics  # noqa: E402

WORKLOAD = ("data.rollout_batch_size=4", "worker.actor.global_batch_size=4", "data.max_response_length=128",
            "algorithm.use_kl_loss=false", "trainer.val_freq=-1", "trainer.val_before_train=false",
            "trainer.save_model_only=true")
SPLIT = ("trainer.n_gpus_per_node=1", "worker.rollout.n_gpus_per_node=1", "trainer.cpu_threads_per_worker=1")
MODES = {
    "colocated": ("trainer.rollout_mode=colocated", "trainer.n_gpus_per_node=1", "trainer.cpu_threads_per_worker=2"),
    "one_step_off": ("trainer.rollout_mode=one_step_off", *SPLIT),
    "async": ("trainer.rollout_mode=async", "trainer.max_staleness=2", "data.mini_rollout_batch_size=1", *SPLIT),
}
BASELINE = "colocated"
RUN_FILE = "run.json"


def overrides(mode: str, root: str, model_path: str, steps: int, extra: list[str]) -> list[str]:
    """The config arguments of one mode's run: the learning config, ``WORKLOAD``, the mode's placement (``MODES``),
    ``steps`` steps, the run folder ``<root>/<mode>``, then ``extra`` (later wins).

    Raises:
        ValueError: ``mode`` is not in ``MODES``.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    return [f"config={CONFIG}", f"worker.actor.model.model_path={model_path}", *WORKLOAD, *MODES[mode],
            f"trainer.max_steps={steps}", f"trainer.runs_root={os.path.dirname(os.path.abspath(root))}",
            f"trainer.project_name={os.path.basename(os.path.abspath(root))}", f"trainer.experiment_name={mode}",
            *extra]


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else float("nan")


def summarize(rows: list[dict]) -> dict:
    """One run's figures (module docstring) from its ``metrics.jsonl`` rows: ``steps``, ``median_step_s`` and
    ``tokens_per_s`` (steady: the steps after the first; all steps when there is one), ``run_tokens_per_s`` (all
    steps), ``rollout_tokens_per_s`` / ``train_tokens_per_s`` (steady medians), ``gen_s`` / ``train_s`` (steady
    medians of a step's generation and busy training seconds), ``train_idle`` / ``rollout_idle`` (idle seconds of
    each side over all step seconds), ``tail_idle`` (median of ``1 - response_length/mean / max``),
    ``slot_occupancy`` (steady median of ``rollout/slot_occupancy``; nan where never reported),
    ``overlap_bound`` (``min(gen, train) / (gen + train)``), ``transfer_s`` (median weight sync/transfer seconds),
    ``staleness_max``, and per step ``reward`` and ``response_length``.

    Raises:
        ValueError: no row with ``timing_s/step``.
    """
    rows = [row for row in rows if "timing_s/step" in row]
    if not rows:
        raise ValueError("no step with timing_s/step in the metrics")
    split = "async/train_idle_s" in rows[0]
    steady = rows[1:] or rows

    def train_busy(row: dict) -> float:  # colocated: the step less generation; split: less waiting and the transfer
        if split:
            return row["timing_s/step"] - row["async/train_idle_s"] - row.get("timing_s/weight_transfer", 0.0)
        return row["timing_s/step"] - row["timing_s/gen"]

    total_s = sum(row["timing_s/step"] for row in rows)
    if split:
        train_idle = sum(row["async/train_idle_s"] for row in rows)
        rollout_idle = sum(row.get("async/rollout_idle_s", 0.0) for row in rows)
    else:  # one set of devices: the training side waits while it generates, the engines while it trains
        train_idle = sum(row["timing_s/gen"] for row in rows)
        rollout_idle = total_s - train_idle
    gen = statistics.median(row["timing_s/gen"] for row in steady)
    train = statistics.median(train_busy(row) for row in steady)
    return {
        "steps": len(rows),
        "median_step_s": statistics.median(row["timing_s/step"] for row in steady),
        "tokens_per_s": statistics.median(row["perf/total_num_tokens"] / row["timing_s/step"] for row in steady),
        "run_tokens_per_s": sum(row["perf/total_num_tokens"] for row in rows) / total_s,
        "rollout_tokens_per_s": statistics.median(row["perf/rollout_tokens_per_s"] for row in steady),
        "train_tokens_per_s": statistics.median(row["perf/total_num_tokens"] / max(train_busy(row), 1e-9)
                                                for row in steady),
        "gen_s": gen, "train_s": train, "overlap_bound": _share(min(gen, train), gen + train),
        "train_idle": _share(train_idle, total_s), "rollout_idle": _share(rollout_idle, total_s),
        "tail_idle": statistics.median(1 - row["response_length/mean"] / row["response_length/max"] for row in rows),
        "slot_occupancy": statistics.median([row["rollout/slot_occupancy"] for row in steady
                                             if "rollout/slot_occupancy" in row] or [float("nan")]),
        "transfer_s": statistics.median(row.get("timing_s/weight_transfer", row.get("timing_s/reshard", 0.0))
                                        for row in steady),
        "staleness_max": max(row.get("async/staleness_max", 0.0) for row in rows),
        "reward": [row.get("reward/overall", float("nan")) for row in rows],
        "response_length": [row["response_length/mean"] for row in rows],
    }


def ratios(summary: dict[str, dict], baseline: str = BASELINE) -> dict[str, dict[str, float]]:
    """Per mode, its steady and whole-run tokens/s over ``baseline``'s and ``baseline``'s s/step over its own (> 1:
    faster). Raises ``KeyError`` when ``baseline`` is not in ``summary``."""
    base = summary[baseline]
    return {mode: {"tokens_per_s": s["tokens_per_s"] / base["tokens_per_s"],
                   "run_tokens_per_s": s["run_tokens_per_s"] / base["run_tokens_per_s"],
                   "step": base["median_step_s"] / s["median_step_s"]} for mode, s in summary.items()}


def model_speedups(gen_share: float, tail: float, devices: int) -> dict[str, float]:
    """The analytic model of bench/README.md ("Rollout while training"): speed-ups over a colocated step of
    ``devices`` devices, whose generation takes ``gen_share`` of the step (0-1) and of it a share ``tail`` (0-1) that
    does not shrink with more devices (the decode steps of the longest responses). Generation on ``n`` devices takes
    ``g (1 - tail) devices / n + g tail``, training on ``m`` takes ``(1 - g) devices / m``. ``one_step_off``: the best
    integer split of the max of the two; ``async``: the same with the tail's slots filled by later batches (partial
    rollouts, enough staleness), so generation is ``g (1 - tail) devices / n``. Returns ``one_step_off``,
    ``one_step_off_rollout_devices``, ``async``, ``async_rollout_devices``. A model, not a measurement.

    Raises:
        ValueError: ``devices`` < 2 (nothing to split) or a share outside [0, 1].
    """
    if devices < 2 or not (0 <= gen_share <= 1 and 0 <= tail <= 1):
        raise ValueError(f"devices={devices} (>= 2), gen_share={gen_share}, tail={tail} (both in [0, 1])")
    g, train = gen_share, 1 - gen_share
    out = {}
    for mode, fixed in (("one_step_off", g * tail), ("async", 0.0)):
        steps = {n: max(g * (1 - tail) * devices / n + fixed, train * devices / (devices - n))
                 for n in range(1, devices)}
        best = min(steps, key=steps.get)
        out[mode], out[f"{mode}_rollout_devices"] = 1 / steps[best], best
    return out


def table(summary: dict[str, dict]) -> str:
    """The Markdown tables of :func:`summarize`'s figures and :func:`ratios` (``colocated`` first where present)."""
    lines = ["| mode | s/step | tokens/s | ratio | whole-run tokens/s | ratio | rollout tokens/s | train tokens/s "
             "| gen s | train s | trainer idle | engines idle | slot occupancy | tail of gen | overlap bound "
             "| staleness max | wall s | load |", "| --- " * 18 + "|"]
    rel = ratios(summary) if BASELINE in summary else {}
    for mode, s in summary.items():
        r = rel.get(mode, {})
        lines.append(f"| {mode} | {s['median_step_s']:.1f} | {s['tokens_per_s']:.0f} | {r.get('tokens_per_s', 0):.2f}"
                     f" | {s['run_tokens_per_s']:.0f} | {r.get('run_tokens_per_s', 0):.2f}"
                     f" | {s['rollout_tokens_per_s']:.0f} | {s['train_tokens_per_s']:.0f} | {s['gen_s']:.1f}"
                     f" | {s['train_s']:.1f} | {s['train_idle']:.0%} | {s['rollout_idle']:.0%}"
                     f" | {s.get('slot_occupancy', float('nan')):.0%} | {s['tail_idle']:.0%}"
                     f" | {s['overlap_bound']:.0%} | {s['staleness_max']:.0f} | {s.get('wall_s', float('nan')):.0f}"
                     f" | {s.get('load_start', float('nan')):.1f}-{s.get('load_end', float('nan')):.1f} |")
    steps = max(s["steps"] for s in summary.values())
    lines += ["", "| mode | " + " | ".join(f"step {k}" for k in range(1, steps + 1)) + " |",
              "| --- " * (steps + 1) + "|"]
    for mode, s in summary.items():
        cells = [f"{r:.3f} ({n:.0f})" for r, n in zip(s["reward"], s["response_length"])]
        lines.append(f"| {mode}: reward (mean length) | " + " | ".join(cells + ["-"] * (steps - len(cells))) + " |")
    return "\n".join(lines)


def report(root: str, results: Optional[str] = None) -> dict[str, dict]:
    """Summaries of every ``<root>/<mode>/metrics.jsonl`` (``MODES`` order) to ``<root>/summary.json`` (and
    ``<results>.json`` / ``.md``), printed as :func:`table`.

    Raises:
        FileNotFoundError: no mode's run under ``root``.
    """
    paths = {mode: os.path.join(root, mode, "metrics.jsonl") for mode in MODES}
    summary = {mode: summarize(read_metrics(path)) for mode, path in paths.items() if os.path.exists(path)}
    if not summary:
        raise FileNotFoundError(f"no {root}/<mode>/metrics.jsonl: run `python bench/async_speed.py` first")
    for mode, s in summary.items():
        if os.path.exists(os.path.join(root, mode, RUN_FILE)):
            with open(os.path.join(root, mode, RUN_FILE), encoding="utf-8") as f:
                s.update(json.load(f))
    out = {"modes": summary, "ratios": ratios(summary) if BASELINE in summary else {}}
    text = table(summary)
    for path, content in ((os.path.join(root, "summary.json"), json.dumps(out, indent=2)),
                          *(((f"{results}.json", json.dumps(out, indent=2)), (f"{results}.md", text + "\n"))
                            if results else ())):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    print(text)
    return out


def run(root: str, steps: int, modes: list[str], extra: list[str], model_path: str,
        results: Optional[str] = None) -> dict:
    """Train ``steps`` steps in each of ``modes``, one after the other (one Ray session each), then :func:`report`.
    Each run's wall seconds (command to exit, start-up included) and the machine's 1-minute load average at its start
    and end go to ``<root>/<mode>/run.json`` (``RUN_FILE``).

    Raises:
        FileExistsError: a mode's run folder exists.
        subprocess.CalledProcessError: a run failed.
    """
    for mode in modes:
        folder = os.path.join(root, mode)
        if os.path.exists(folder):
            raise FileExistsError(f"{folder} exists: delete it to run again, or pass another --root")
    for mode in modes:
        began, load = time.time(), os.getloadavg()[0]
        train("easyrl", overrides(mode, root, model_path, steps, extra))
        folder = os.path.join(root, mode)
        for path in glob.glob(os.path.join(folder, "global_step_*")) + [os.path.join(folder, "huggingface")]:
            shutil.rmtree(path, ignore_errors=True)  # GBs of weights this benchmark does not need
        with open(os.path.join(folder, RUN_FILE), "w", encoding="utf-8") as f:
            json.dump({"wall_s": time.time() - began, "load_start": load, "load_end": os.getloadavg()[0]}, f)
    return report(root, results)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", action="store_true", help="only print the table of the runs under --root")
    parser.add_argument("--modes", nargs="+", choices=tuple(MODES), default=list(MODES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--root", default=os.path.join("runs", "bench", "async_speed"))
    parser.add_argument("--results", default=os.path.join(REPO, "bench", "results", "async_speed"),
                        help="write <results>.json and <results>.md too ('' for none)")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides for every mode")
    args = parser.parse_args(argv)
    if args.report:
        report(args.root, args.results or None)
        return
    from easyrl.testing.smollm2 import smollm2_path

    run(args.root, args.steps, args.modes, args.overrides, str(smollm2_path()), args.results or None)


if __name__ == "__main__":
    main()
