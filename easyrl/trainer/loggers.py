"""Where metrics go: the console (``easyrl.trainer.console``), a JSONL file in the run folder, and the dashboards of
``easyrl.trainer.dashboards`` (Weights & Biases, TensorBoard, SwanLab, MLflow).

``trainer.logger`` lists the backends; each receives ``log(metrics, step, generations=None)`` with flat
``group/name`` keys. The JSONL file (``<run_dir>/metrics.jsonl``) has one object per step:
``{"step": int, "<metric>": float, ...}``, and on validation steps with ``trainer.val_generations_to_log > 0`` also
``"val/generations": [{"prompt", "response", "ground_truth", "score"}, ...]``.
"""

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
    """Writes one JSON object per step to ``path`` (non-finite values are written as strings).

    The file is only ever appended to. A resumed run (``resume=True``) adds its steps after the earlier rows: when
    the interrupted run had logged steps after its last checkpoint, those steps appear twice and the later row of a
    step is the one of the resumed run. A new run (``resume=False``) refuses a file that already holds rows.

    Raises:
        RunStateError: ``path`` holds another run's metrics and ``resume`` is False.
    """

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
    """Fans metrics out to the backends named in ``trainer.logger`` (``easyrl.config.trainer.BACKENDS``); their files
    go under ``run_dir``; ``config`` (a plain dict) is logged by the dashboards; ``total_steps`` and
    ``initial_step`` size the console's progress bar (a resumed run's bar starts at its step).

    Raises:
        ConfigError: an unknown backend name or a missing library (see ``check_backends``).
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
        """Send one step's metrics (flat ``group/name`` keys), and validation generations if any, to every backend."""
        for backend in self.loggers:
            backend.log(metrics, step, generations)

    def close(self) -> None:
        """Flush and close every backend."""
        for backend in self.loggers:
            backend.close()
