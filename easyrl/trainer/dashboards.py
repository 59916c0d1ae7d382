"""The dashboard backends of ``trainer.logger``: Weights & Biases, TensorBoard, SwanLab, MLflow.

Each is an optional dependency (an extra: ``pip install 'easyrl[wandb]'``), checked when the config is loaded
(``easyrl.config.trainer.check_backends``). Each takes ``log(metrics, step, generations=None)``: flat ``group/name``
metrics, and on validation steps the first ``trainer.val_generations_to_log`` samples as rows
``{"prompt", "response", "ground_truth", "score"}``, logged as a table named ``val/generations``.

Where each writes, and the library's own switches (online/offline modes are the libraries' environment variables):

- wandb: ``<run_dir>/wandb``; ``WANDB_MODE=offline`` keeps the run on disk (``wandb sync`` uploads it later).
- tensorboard: ``<run_dir>/tensorboard`` event files (generations as a text table).
- swanlab: ``<run_dir>/swanlog`` (``SWANLAB_LOGDIR`` overrides); ``SWANLAB_MODE=offline`` (sync later) or ``local``
  (needs ``swanlab[dashboard]``); default: SwanLab's own (cloud, after ``swanlab login``).
- mlflow: ``MLFLOW_TRACKING_URI`` if set, else a local file store ``<run_dir>/mlruns`` (``mlflow ui
  --backend-store-uri <run_dir>/mlruns``). MLflow 3 keeps its file store in maintenance mode and refuses it unless
  ``MLFLOW_ALLOW_FILE_STORE=true``, which is set for this local default only. The config is logged as
  ``config.json``, generations as ``val_generations/step_<step>.json``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

GENERATION_COLUMNS = ("step", "prompt", "response", "ground_truth", "score")


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _table_rows(generations: list[dict[str, Any]], step: int) -> list[list[Any]]:
    return [[step, g["prompt"], g["response"], g["ground_truth"], g["score"]] for g in generations]


class WandbLogger:
    """A Weights & Biases run ``project/experiment`` with the whole config, under ``<run_dir>/wandb``."""

    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        import wandb

        os.makedirs(run_dir, exist_ok=True)
        self.wandb = wandb
        self.run = wandb.init(project=project, name=experiment, config=config, dir=run_dir)

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        row: dict[str, Any] = _numeric(metrics)
        if generations:
            row["val/generations"] = self.wandb.Table(columns=list(GENERATION_COLUMNS),
                                                      data=_table_rows(generations, step))
        self.run.log(row, step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardLogger:
    """TensorBoard event files under ``<run_dir>/tensorboard``; generations as a markdown table (text plugin)."""

    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        for key, value in _numeric(metrics).items():
            self.writer.add_scalar(key, value, step)
        if generations:
            lines = ["| " + " | ".join(GENERATION_COLUMNS[1:]) + " |", "|---|---|---|---|"]
            for row in _table_rows(generations, step):
                cells = [str(c).replace("|", "\\|").replace("\n", " ") for c in row[1:]]
                lines.append("| " + " | ".join(cells) + " |")
            self.writer.add_text("val/generations", "\n".join(lines), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class SwanlabLogger:
    """A SwanLab run ``project/experiment`` with the whole config, under ``<run_dir>/swanlog``."""

    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        import swanlab

        self.swanlab = swanlab
        log_dir = os.environ.get("SWANLAB_LOGDIR") or os.path.join(run_dir, "swanlog")
        os.makedirs(log_dir, exist_ok=True)
        self.run = swanlab.init(project=project, name=experiment, config=config, log_dir=log_dir, reinit=True)

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        row: dict[str, Any] = _numeric(metrics)
        if generations:
            table = self.swanlab.echarts.Table()
            table.add(list(GENERATION_COLUMNS), _table_rows(generations, step))
            row["val/generations"] = table
        self.swanlab.log(row, step=step)

    def close(self) -> None:
        self.swanlab.finish()


class MlflowLogger:
    """An MLflow run ``experiment`` in experiment ``project`` (see the module docstring for the store)."""

    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = "file:" + os.path.abspath(os.path.join(run_dir, "mlruns"))
        self.tracking_uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(project)
        experiment_id = found.experiment_id if found else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment_id, run_name=experiment).info.run_id
        self.client.log_dict(self.run_id, config, "config.json")

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, step) for key, value in _numeric(metrics).items()]
        for start in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=batch[start:start + 1000])
        if generations:
            self.client.log_dict(self.run_id, {"columns": list(GENERATION_COLUMNS),
                                               "data": _table_rows(generations, step)},
                                 f"val_generations/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
