"""``python -m easyrl.plot RUN_DIR [RUN_DIR ...]`` (or ``easyrl plot``): one figure of a run's metrics over steps.

Reads ``<run_dir>/metrics.jsonl`` of each run and draws the panels of ``PANELS`` (reward and accuracy, response
length, KL, entropy, clip fraction, grad norm, phase timings, throughput, memory) with matplotlib, all runs on the
same axes (color: the series; line style: the run). Writes a PNG and an HTML page (the PNG embedded, plus a table of
each run's last values), by default ``<first run_dir>/plots/metrics.{png,html}``.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Optional

# (title, y label, [(metric key, legend label)])
PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("reward and accuracy", "score", (("critic/score/mean", "reward"), ("reward/accuracy", "accuracy"),
                                      ("val/reward/overall", "val reward"),
                                      ("reward/frac_reward_zero_std", "groups w/o reward spread"))),
    ("response length", "tokens", (("response_length/mean", "mean"), ("response_length/max", "max"),
                                   ("response_length/min", "min"))),
    ("KL", "KL", (("actor/kl_loss", "KL loss"), ("actor/reward_kl_penalty", "KL in reward"),
                  ("actor/ppo_kl", "PPO KL (new vs old)"))),
    ("entropy", "nats / token", (("actor/entropy", "entropy"),)),
    ("clip fraction", "fraction", (("actor/pg_clipfrac", "ratio clipped"),
                                   ("actor/pg_clipfrac_lower", "dual-clip lower"),
                                   ("response_length/clip_ratio", "responses cut at max length"))),
    ("grad norm", "L2 norm", (("actor/grad_norm", "grad norm"),)),
    ("phase timings", "seconds", (("timing_s/gen", "gen"), ("timing_s/reshard", "weight sync"),
                                  ("timing_s/reward", "reward"), ("timing_s/old_log_prob", "old log-prob"),
                                  ("timing_s/ref", "ref"), ("timing_s/update_actor", "update actor"),
                                  ("timing_s/step", "step"))),
    ("throughput", "tokens / s", (("perf/throughput", "per device"), ("perf/rollout_tokens_per_s", "rollout"),
                                  ("perf/update_tokens_per_s", "update"))),
    ("memory", "GiB", (("perf/cpu_memory_used_gb", "host RSS"), ("perf/max_memory_allocated_gb", "device allocated"),
                       ("perf/max_memory_reserved_gb", "device reserved"))),
)
LINE_STYLES = ("-", "--", ":", "-.")


@dataclass
class Run:
    """One run's metrics: ``name`` and ``series[key] = (steps, values)`` of every numeric metric."""

    name: str
    series: dict[str, tuple[list[int], list[float]]]


def read_run(path: str, name: Optional[str] = None) -> Run:
    """Read ``path`` (a run folder or its ``metrics.jsonl``). Non-finite values (written as strings) come back as
    floats; other non-numbers (validation generations) are skipped.

    Raises:
        FileNotFoundError: no metrics.jsonl there. ValueError: a line is not JSON (names file and line).
    """
    file = path if path.endswith(".jsonl") else os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} does not exist: give a run folder (runs/<project>/<experiment>) that has one.")
    series: dict[str, tuple[list[int], list[float]]] = {}
    with open(file, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}:{number} is not a JSON object ({e}).") from None
            step = row.get("step")
            for key, value in row.items():
                if key == "step" or isinstance(value, bool):
                    continue
                if isinstance(value, str) and value in ("nan", "inf", "-inf"):
                    value = float(value)
                if isinstance(value, (int, float)):
                    steps, values = series.setdefault(key, ([], []))
                    steps.append(step)
                    values.append(float(value))
    run_name = name or os.path.basename(os.path.dirname(os.path.abspath(file)))
    return Run(run_name, series)


def plot_runs(runs: list[Run], output: str):
    """Draw ``PANELS`` for ``runs`` into ``output`` (a .png path) and ``output`` with .html. Returns the figure
    (its axes carry the panel titles and lines, for inspection)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cols = 3
    rows = math.ceil(len(PANELS) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    for ax, (title, ylabel, keys) in zip(axes.flat, PANELS):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        for color, (key, label) in enumerate(keys):
            for r, run in enumerate(runs):
                if key not in run.series:
                    continue
                steps, values = run.series[key]
                name = f"{run.name}: {label}" if len(runs) > 1 else label
                ax.plot(steps, values, LINE_STYLES[r % len(LINE_STYLES)], color=f"C{color}", marker="o",
                        markersize=3, label=name)
        if ax.lines:
            ax.ticklabel_format(axis="y", useOffset=False)  # 11.8799 rather than 0.0009 + 1.1879e1
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    for ax in list(axes.flat)[len(PANELS):]:
        ax.axis("off")
    fig.suptitle(" vs ".join(run.name for run in runs))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    fig.savefig(output, dpi=90)
    _write_html(runs, output)
    plt.close(fig)
    return fig


def _write_html(runs: list[Run], png: str) -> str:
    """An HTML page beside ``png``: the figure embedded and each run's last value of every panel metric."""
    import jinja2

    with open(png, "rb") as f:
        image = base64.b64encode(f.read()).decode()
    keys = [key for _, _, pairs in PANELS for key, _ in pairs if any(key in run.series for run in runs)]
    last = {run.name: {key: run.series[key][1][-1] for key in keys if key in run.series} for run in runs}
    template = jinja2.Template(
        "<!doctype html><html><head><meta charset='utf-8'><title>easyrl: {{ title }}</title>"
        "<style>body{font-family:sans-serif} td,th{padding:2px 8px;text-align:right} td:first-child{text-align:left}"
        "</style></head><body><h1>{{ title }}</h1><img src='data:image/png;base64,{{ image }}' style='max-width:100%'>"
        "<h2>last values</h2><table><tr><th>metric</th>{% for run in last %}<th>{{ run }}</th>{% endfor %}</tr>"
        "{% for key in keys %}<tr><td>{{ key }}</td>{% for run in last %}<td>{{ '%.4g' % last[run][key] "
        "if key in last[run] else '' }}</td>{% endfor %}</tr>{% endfor %}</table></body></html>",
        autoescape=True)
    path = os.path.splitext(png)[0] + ".html"
    with open(path, "w", encoding="utf-8") as f:
        f.write(template.render(title=" vs ".join(last), image=image, last=last, keys=keys))
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line of ``easyrl plot`` / ``python -m easyrl.plot``."""
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders (or metrics.jsonl files)")
    parser.add_argument("-o", "--output", help="PNG path (default <first RUN_DIR>/plots/metrics.png); "
                                               "the HTML page is written beside it")


def run_command(args: argparse.Namespace) -> int:
    """Plot ``args.run_dirs``; prints the PNG and HTML paths. Returns the exit status (2: a run cannot be read)."""
    try:
        runs = [read_run(path) for path in args.run_dirs]
    except (FileNotFoundError, ValueError) as e:
        print(f"easyrl plot: {e}", file=sys.stderr)
        return 2
    names = [run.name for run in runs]
    for run, path in zip(runs, args.run_dirs):  # two runs with one folder name: tell them apart by their paths
        if names.count(run.name) > 1:
            run.name = os.path.normpath(path)
    first = args.run_dirs[0]
    output = args.output or os.path.join(os.path.dirname(first) if first.endswith(".jsonl") else first,
                                         "plots", "metrics.png")
    plot_runs(runs, output)
    print(output)
    print(os.path.splitext(output)[0] + ".html")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m easyrl.plot", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
