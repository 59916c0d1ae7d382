"""Where metrics go: the backends of ``trainer.logger`` (the console, ``<run_dir>/metrics.jsonl``, the dashboards),
each given ``log(metrics, step, generations=None)`` with flat ``group/name`` keys (docs/metrics.md)."""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Optional

from easyrl.config.trainer import check_backends
from easyrl.trainer.console import ConsoleLogger
from easyrl.trainer.dashboards import MlflowLogger, SwanlabLogger, TensorBoardLogger, WandbLogger
from easyrl.trainer.run_folder import METRICS_FILE, refuse_existing_metrics

logger = logging.getLogger("easyrl.metrics")


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
