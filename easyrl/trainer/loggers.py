"""Where metrics go: the backends of ``trainer.logger`` (the console: a tqdm bar and one short line per step;
``<run_dir>/metrics.jsonl``; the dashboards), each given ``log(metrics, step, generations=None)`` with flat
``group/name`` keys (docs/metrics.md)."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from typing import Any, Optional

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from easyrl.config.trainer import check_backends
from easyrl.trainer.dashboards import MlflowLogger, SwanlabLogger, TensorBoardLogger, WandbLogger
from easyrl.trainer.run_folder import METRICS_FILE, refuse_existing_metrics

logger = logging.getLogger("easyrl.metrics")


# (label, metric keys tried in order, format): the first key present in a step's metrics is shown
SUMMARY_FIELDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("reward", ("critic/score/mean", "reward/overall"), "{:.3f}"),
    ("acc", ("reward/accuracy",), "{:.3f}"),
    ("len", ("response_length/mean",), "{:.1f}"),
    ("tools", ("multi_turn/tool_calls_per_traj/mean",), "{:.2f}/sample"),
    ("errors", ("multi_turn/tool_errors",), "{:.0f}"),
    ("kl", ("actor/kl_loss", "actor/reward_kl_penalty"), "{:.4f}"),
    ("ent", ("actor/entropy",), "{:.3g}"),
    ("", ("timing_s/step",), "{:.1f}s"),
    ("", ("perf/throughput",), "{:.0f} tok/s/dev"),
    ("mfu", ("perf/mfu/actor",), "{:.1%}"),
    ("val", ("val/reward/overall",), "{:.3f}"),
)
SHARED_FIELDS = {"acc": "reward", "errors": "tools"}  # a field shown in the part of the field named here


def summary_line(metrics: dict[str, float], step: int, total: Optional[int] = None) -> str:
    """``step 3/10 | reward 0.412 acc 0.250 | ...``: the :data:`SUMMARY_FIELDS` present in ``metrics``, in order
    (:data:`SHARED_FIELDS` share their part)."""
    head = f"step {step}/{total}" if total else f"step {step}"
    parts = [head]
    for label, keys, fmt in SUMMARY_FIELDS:
        key = next((k for k in keys if k in metrics and isinstance(metrics[k], (int, float))), None)
        if key is None:
            continue
        text = (f"{label} " if label else "") + fmt.format(metrics[key])
        if parts[-1].startswith(SHARED_FIELDS.get(label, "|")):
            parts[-1] += " " + text
        else:
            parts.append(text)
    return " | ".join(parts)


class ConsoleLogger:
    """A tqdm bar over ``total_steps`` (``initial`` done already) with the latest reward, and :func:`summary_line`
    per logged step above it (stderr)."""

    def __init__(self, total_steps: Optional[int] = None, initial: int = 0):
        self.total = total_steps
        self.bar = None
        self._redirect = None
        if total_steps:
            self.bar = tqdm(total=total_steps, initial=initial, desc="training", unit="step", file=sys.stderr,
                            dynamic_ncols=True, mininterval=1.0)
            # log records of this process (warnings) are written above the bar instead of through it
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        """Write the step's summary line and move the bar to ``step``."""
        line = summary_line(metrics, step, self.total)
        if self.bar is None:
            print(line, file=sys.stderr, flush=True)
            return
        self.bar.write(line, file=sys.stderr)
        reward = metrics.get("critic/score/mean")
        if isinstance(reward, (int, float)):
            self.bar.set_postfix(reward=f"{reward:.3f}", refresh=False)
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        if self.bar is not None:
            self.bar.close()


class JsonlLogger:
    """Appends one JSON object per step to ``path`` (non-finite values as strings); a new run (not ``resume``)
    refuses a file that holds rows (``RunStateError``)."""

    def __init__(self, path: str, resume: bool = False):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if not resume:
            refuse_existing_metrics(path)
        self.path = path
        self.file = open(path, "a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        row: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            row[key] = value if not isinstance(value, float) or math.isfinite(value) else str(value)
        if generations:
            row["val/generations"] = generations
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class Tracker:
    """Fans metrics out to the backends named in ``trainer.logger``, writing under ``run_dir``; ``config`` (a dict)
    goes to the dashboards, ``total_steps`` and ``initial_step`` size the console's bar.

    Raises:
        ConfigError: an unknown backend or a missing library.
        RunStateError: a new run in a folder with another run's metrics.
    """

    def __init__(self, backends: list[str], run_dir: str, project: str, experiment: str, config: dict[str, Any],
                 total_steps: Optional[int] = None, initial_step: int = 0, resume: bool = False):
        check_backends(backends)
        self.loggers = []
        for name in backends:
            if name == "console":
                self.loggers.append(ConsoleLogger(total_steps, initial_step))
            elif name == "jsonl":
                self.loggers.append(JsonlLogger(os.path.join(run_dir, METRICS_FILE), resume=resume))
            elif name == "tensorboard":
                self.loggers.append(TensorBoardLogger(os.path.join(run_dir, "tensorboard")))
            elif name == "wandb":
                self.loggers.append(WandbLogger(run_dir, project, experiment, config, resume=resume))
            else:
                cls = {"swanlab": SwanlabLogger, "mlflow": MlflowLogger}[name]
                self.loggers.append(cls(run_dir, project, experiment, config))

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        """Send one step's metrics and validation generations (if any) to every backend."""
        for backend in self.loggers:
            backend.log(metrics, step, generations)

    def close(self) -> None:
        """Flush and close every backend."""
        for backend in self.loggers:
            backend.close()
