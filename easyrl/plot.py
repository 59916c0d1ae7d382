"""``python -m easyrl.plot RUN_DIR [RUN_DIR ...]`` (or ``easyrl plot``): one figure of a run's metrics over steps.

Each run's ``metrics.jsonl`` is drawn on the ``PANELS`` it logged (one quantity per panel, training and validation
side by side; color and marker: the metric, line style: the run); panels no run logged are named under the figure.
A nearly flat series stays flat (``MIN_RELATIVE_SPAN``). Writes a PNG and an HTML page (the PNG plus each run's last
values), by default ``<first run_dir>/plots/metrics.{png,html}``.
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

from easyrl.errors import RunStateError, run_cli


@dataclass(frozen=True)
class Panel:
    """One axis: a quantity (``unit``) and its metrics.jsonl ``keys``; ``fraction``: values in [0, 1]; ``prefix``: also
    every logged ``<prefix><name>`` (or ``.../mean``) key that no panel names, in logged order."""

    title: str
    unit: str
    keys: tuple[str, ...] = ()
    fraction: bool = False
    prefix: Optional[str] = None

    def drawn_keys(self, runs: list["Run"]) -> list[str]:
        """``keys``, then the keys of ``runs`` that ``prefix`` matches."""
        found = list(self.keys)
        if self.prefix is not None:
            named = {key for panel in PANELS for key in panel.keys}
            for run in runs:
                for key in run.series:
                    rest = key[len(self.prefix):].removesuffix("/mean")
                    if key.startswith(self.prefix) and "/" not in rest and key not in named and key not in found:
                        found.append(key)
        return found


PANELS: tuple[Panel, ...] = (
    Panel("reward", "score (reward function's overall)", ("critic/score/mean", "val/reward/overall")),
    Panel("accuracy", "fraction correct", ("reward/accuracy", "val/reward/accuracy"), fraction=True),
    Panel("groups without reward spread", "fraction of groups", ("reward/frac_reward_zero_std",), fraction=True),
    Panel("response length", "tokens", ("response_length/mean", "response_length/max", "response_length/min",
                                        "val/response_length/mean")),
    Panel("responses cut at max length", "fraction of responses", ("response_length/clip_ratio",), fraction=True),
    Panel("KL", "nats / token", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    Panel("entropy", "nats / token", ("actor/entropy",)),
    Panel("PPO clip fraction", "fraction of tokens", ("actor/pg_clipfrac", "actor/pg_clipfrac_lower"), fraction=True),
    Panel("grad norm", "L2 norm before clipping", ("actor/grad_norm", "critic/grad_norm")),
    Panel("phase timings", "seconds", prefix="timing_s/"),
    Panel("multi-turn", "per step / per trajectory", prefix="multi_turn/"),
    Panel("tool-turn tokens", "fraction of response tokens masked from the loss", ("multi_turn/masked_token_share",),
          fraction=True),
    Panel("LLM judge", "score / unreadable verdicts", ("reward/judge", "val/reward/judge"), prefix="judge/"),
    Panel("reward model", "score / truncated inputs", ("reward/reward_model", "val/reward/reward_model"),
          prefix="reward_model/"),
    Panel("throughput per device", "tokens / s / device", ("perf/throughput",)),
    Panel("throughput, all devices", "tokens / s", ("perf/throughput_total", "perf/rollout_tokens_per_s",
                                                    "perf/update_tokens_per_s")),
    Panel("MFU", "fraction of peak FLOP/s", ("perf/mfu/actor", "perf/mfu/rollout"), fraction=True),
    Panel("memory", "GiB", ("perf/cpu_memory_used_gb", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb")),
)
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
MIN_RELATIVE_SPAN = 0.05  # a y axis spans at least 5% of the largest |value| (a change below that is drawn flat)


def y_limits(values: list[float], fraction: bool = False) -> Optional[tuple[float, float]]:
    """Limits spanning at least ``MIN_RELATIVE_SPAN`` x the largest ``|value|`` (1 for all zeros), centred on the
    values, from 0 for non-negative values and at most 1 for a ``fraction``; None (autoscale) for a wider spread."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    lo, hi = min(finite), max(finite)
    magnitude = max(abs(lo), abs(hi))
    min_span = MIN_RELATIVE_SPAN * magnitude if magnitude > 0 else 1.0
    if hi - lo >= min_span:
        return None
    bottom = (lo + hi) / 2 - min_span / 2
    if lo >= 0 > bottom:
        bottom = 0.0
    top = bottom + min_span
    if fraction and hi <= 1 < top:
        bottom, top = max(0.0, 1.0 - min_span), 1.0
    return bottom, top


@dataclass
class Run:
    """One run's metrics: ``name`` and ``series[key] = (steps, values)`` of every numeric metric."""

    name: str
    series: dict[str, tuple[list[int], list[float]]]


def read_run(path: str, name: Optional[str] = None) -> Run:
    """The numeric metrics of ``path`` (a run folder or its ``metrics.jsonl``; ``"nan"``/``"inf"`` strings read as
    floats). RunStateError without the file or for a line that is not JSON (a last line cut short is skipped)."""
    file = path if path.endswith(".jsonl") else os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(file):
        raise RunStateError(f"{file} does not exist: give a run folder (runs/<project>/<experiment>) that has one.")
    series: dict[str, tuple[list[int], list[float]]] = {}
    with open(file, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("\n"):  # the last line of a run stopped while writing it: plot the rest
                    print(f"easyrl: {file}:{number} is cut short (the run stopped while writing it); plotted without "
                          "it", file=sys.stderr)
                    break
                raise RunStateError(f"{file}:{number} is not a JSON object ({e}).") from None
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
    """Draw ``runs`` into ``output`` (.png) and its .html; returns the figure (lines labelled with the keys, prefixed
    ``<run>: `` for several runs; ``fig.texts`` names the panels left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    shown = [panel for panel in PANELS if any(key in run.series for key in panel.drawn_keys(runs) for run in runs)]
    missing = [panel.title for panel in PANELS if panel not in shown]
    cols = 3
    rows = max(1, math.ceil(len(shown) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, shown):
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(panel.unit)
        drawn: list[float] = []
        keys = panel.drawn_keys(runs)
        palette = plt.get_cmap("tab10" if len(keys) <= 10 else "tab20")
        colors = (lambda i: palette(i)) if len(keys) <= 10 else (lambda i: palette(2 * i % 20 + 2 * i // 20))
        for index, key in enumerate(keys):
            for r, run in enumerate(runs):
                if key not in run.series:
                    continue
                steps, values = run.series[key]
                drawn += values
                ax.plot(steps, values, LINE_STYLES[r % len(LINE_STYLES)], color=colors(index),
                        marker=MARKERS[index % len(MARKERS)], markersize=4, alpha=0.85,
                        label=f"{run.name}: {key}" if len(runs) > 1 else key)
        formatter = ScalarFormatter(useOffset=False)  # 11.88, never 0.0001 + 1.1879e1
        formatter.set_powerlimits((-3, 5))
        ax.yaxis.set_major_formatter(formatter)
        limits = y_limits(drawn, panel.fraction)
        if limits is not None:
            ax.set_ylim(*limits)
        _legend(ax, runs)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    fig.suptitle(" vs ".join(run.name for run in runs))
    if missing:
        fig.text(0.5, 0.005, "not logged: " + ", ".join(missing), ha="center", va="bottom", fontsize=8, color="gray")
    fig.tight_layout(rect=(0, 0.02 if missing else 0, 1, 1 - 0.3 / fig.get_figheight()))
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    fig.savefig(output, dpi=90)
    _write_html(runs, output)
    plt.close(fig)
    return fig


def _legend(ax, runs: list[Run]) -> None:
    """An entry per line for one run; else one per metric and one per run (its line style)."""
    if len(runs) == 1:
        ax.legend(fontsize=7)
        return
    from matplotlib.lines import Line2D

    metrics: dict[str, Line2D] = {}
    for line in ax.lines:
        key = line.get_label().split(": ", 1)[1]
        metrics.setdefault(key, Line2D([], [], color=line.get_color(), marker=line.get_marker(), markersize=4,
                                       label=key))
    styles = [Line2D([], [], color="gray", linestyle=LINE_STYLES[r % len(LINE_STYLES)], label=run.name)
              for r, run in enumerate(runs)]
    ax.legend(handles=list(metrics.values()) + styles, fontsize=7)


def _write_html(runs: list[Run], png: str) -> str:
    """An HTML page beside ``png``: the figure embedded and each run's last value of every panel metric."""
    import jinja2

    with open(png, "rb") as f:
        image = base64.b64encode(f.read()).decode()
    keys = [key for panel in PANELS for key in panel.drawn_keys(runs) if any(key in run.series for run in runs)]
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


def _plot(args: argparse.Namespace) -> int:
    runs = [read_run(path) for path in args.run_dirs]
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


def main(argv: Optional[list[str]] = None, prog: str = "python -m easyrl.plot",
         description: str = __doc__.splitlines()[0]) -> int:
    """Plot the runs and print the PNG and HTML paths; exit status 0, or 2 when a run cannot be read."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders (or metrics.jsonl files)")
    parser.add_argument("-o", "--output", help="PNG path (default <first RUN_DIR>/plots/metrics.png); "
                                               "the HTML page is written beside it")
    args = parser.parse_args(argv)
    return run_cli(lambda: _plot(args))


if __name__ == "__main__":
    sys.exit(main())
