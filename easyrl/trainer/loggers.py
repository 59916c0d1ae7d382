"""Where metrics go: the console, a JSONL file in the run folder, Weights & Biases, TensorBoard.

``trainer.logger`` lists the backends; each receives ``log(metrics, step)`` with flat ``group/name`` keys.
The JSONL file (``<run_dir>/metrics.jsonl``) has one object per step: ``{"step": int, "<metric>": float, ...}``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

logger = logging.getLogger("easyrl.metrics")


class ConsoleLogger:
    """One line per step: ``step 3 | actor/pg_loss: 0.0123 | ...`` (keys sorted)."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        parts = [f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in sorted(metrics.items())]
        logger.info("step %d | %s", step, " | ".join(parts))

    def close(self) -> None:
        pass


def refuse_existing_metrics(path: str) -> None:
    """Raise ``RunStateError`` if ``path`` (a ``metrics.jsonl``) already holds rows."""
    if os.path.exists(path) and os.path.getsize(path) > 0:
        from easyrl.trainer.checkpoint import RunStateError

        raise RunStateError(
            f"{path} holds the metrics of another run and there is no checkpoint to resume it from. A run never "
            f"overwrites another: choose a new trainer.experiment_name (or trainer.runs_root), or move the old "
            f"folder away."
        )


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

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step}
        for key, value in metrics.items():
            row[key] = value if not isinstance(value, float) or math.isfinite(value) else str(value)
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class WandbLogger:
    """Weights & Biases run ``project/experiment`` with the whole config (needs ``pip install wandb``)."""

    def __init__(self, project: str, experiment: str, config: dict[str, Any]):
        try:
            import wandb
        except ImportError:
            raise ImportError("trainer.logger contains 'wandb' but wandb is not installed: uv sync --extra wandb") from None
        self.run = wandb.init(project=project, name=experiment, config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardLogger:
    """TensorBoard event files under ``<run_dir>/tensorboard``."""

    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Tracker:
    """Fans metrics out to the backends named in ``trainer.logger``; ``resume``: a resumed run (see ``JsonlLogger``).

    Raises:
        ValueError: an unknown backend name.
        RunStateError: a new run in a folder with another run's metrics.
    """

    BACKENDS = ("console", "jsonl", "wandb", "tensorboard")

    def __init__(self, backends: list[str], run_dir: str, project: str, experiment: str, config: dict[str, Any],
                 resume: bool = False):
        self.loggers = []
        for name in backends:
            if name == "console":
                self.loggers.append(ConsoleLogger())
            elif name == "jsonl":
                self.loggers.append(JsonlLogger(os.path.join(run_dir, "metrics.jsonl"), resume=resume))
            elif name == "wandb":
                self.loggers.append(WandbLogger(project, experiment, config))
            elif name == "tensorboard":
                self.loggers.append(TensorBoardLogger(os.path.join(run_dir, "tensorboard")))
            else:
                raise ValueError(f"trainer.logger: unknown backend '{name}'; choose from {', '.join(self.BACKENDS)}.")

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Send one step's metrics (flat ``group/name`` keys) to every backend."""
        for backend in self.loggers:
            backend.log(metrics, step)

    def close(self) -> None:
        """Flush and close every backend."""
        for backend in self.loggers:
            backend.close()
