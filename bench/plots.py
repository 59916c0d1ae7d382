"""PNG plots of easyrl / TRL ``metrics.jsonl`` files (matplotlib, no display needed).

    python bench/plots.py runs/easyrl/smollm2_learn/metrics.jsonl            # -> .../learning.png
    python bench/plots.py a/metrics.jsonl b/metrics.jsonl --labels easyrl TRL --output both.png

One panel each for the training reward, the validation accuracy and the mean response length (training and
validation), one line per run; for several seeds of one run, give one label per file and lines of a label share
its colour.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Optional, Sequence

PANELS = (
    ("reward/overall", "training reward (mean over samples)"),
    ("val/reward/accuracy", "validation accuracy (held-out prompts)"),
    ("response_length/mean", "response length (tokens)"),
)


def read_metrics(path: str) -> list[dict]:
    """The rows of a ``metrics.jsonl`` (one JSON object per line, with a ``step``).

    Raises:
        FileNotFoundError, ValueError: the file is missing or a line is not JSON (the message names file and line).
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path} line {number} is not JSON: {err}") from None
    return rows


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of the rows that hold ``key``."""
    points = [(row["step"], row[key]) for row in rows if key in row]
    return [s for s, _ in points], [v for _, v in points]


def plot_runs(paths: Sequence[str], output: str, labels: Optional[Sequence[str]] = None,
              title: Optional[str] = None) -> str:
    """Plot reward, validation accuracy and response length of each run into ``output`` (PNG); returns it.

    Args:
        paths: ``metrics.jsonl`` files.
        labels: one per path (default: the run folder's name); equal labels share a colour (seeds of one setup).
        title: the figure's title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(labels) if labels else [os.path.basename(os.path.dirname(os.path.abspath(p))) for p in paths]
    if len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} metrics files")
    colours = {label: f"C{i}" for i, label in enumerate(dict.fromkeys(labels))}
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.8))
    shown: set[tuple[int, str]] = set()
    for path, label in zip(paths, labels):
        rows = read_metrics(path)
        for i, (key, name) in enumerate(PANELS):
            ax = axes[i]
            for metric, style in ((key, "-"), (f"val/{key}" if key == "response_length/mean" else None, "--")):
                if metric is None:
                    continue
                steps, values = series(rows, metric)
                if not steps:
                    continue
                legend = label if metric == key else f"{label} (validation)"
                ax.plot(steps, values, style, marker="o" if len(steps) < 12 else None, markersize=3,
                        color=colours[label], label=None if (i, legend) in shown else legend)
                shown.add((i, legend))
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Plot metrics.jsonl files to a PNG.")
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--labels", nargs="*", default=None)
    parser.add_argument("--output", default=None, help="default: learning.png beside the first file")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    output = args.output or os.path.join(os.path.dirname(os.path.abspath(args.paths[0])), "learning.png")
    print(plot_runs(args.paths, output, args.labels, args.title))


if __name__ == "__main__":
    main()
