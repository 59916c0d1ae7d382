"""The dashboard backends of ``trainer.logger``: Weights & Biases, TensorBoard, SwanLab, MLflow, each an optional
extra with ``log(metrics, step, generations=None)``; where each writes and its offline switch: docs/metrics.md."""

from __future__ import annotations

import netrc
import os
import time
from typing import Any, Optional
from urllib.parse import urlparse

from easyrl.errors import ConfigError

WANDB_ID_FILE = "wandb_run_id"
_OFFLINE = ("offline", "dryrun", "disabled", "local")


def check_logger_credentials(trainer) -> None:
    """Online wandb / swanlab in ``trainer.logger`` have a login (an API key variable or a netrc entry), checked
    before any worker starts; else ``ConfigError`` naming the variable to set and the offline switch."""
    backends = trainer.logger
    if "wandb" in backends and os.environ.get("WANDB_MODE", "").lower() not in _OFFLINE \
            and os.environ.get("WANDB_DISABLED", "").lower() not in ("true", "1") \
            and not os.environ.get("WANDB_API_KEY"):
        host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
        path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
        try:
            logged_in = os.path.isfile(path) and netrc.netrc(path).authenticators(host) is not None
        except (netrc.NetrcParseError, OSError):
            logged_in = False
        if not logged_in:
            raise ConfigError(
                f"trainer.logger has wandb but no wandb login was found (no WANDB_API_KEY, no {host} entry in "
                f"~/.netrc): set WANDB_API_KEY or run `wandb login`, or set WANDB_MODE=offline to keep the run on disk "
                f"(`wandb sync` uploads it later), or drop wandb from trainer.logger."
            )
    if "swanlab" in backends and os.environ.get("SWANLAB_MODE", "").lower() not in _OFFLINE \
            and not os.environ.get("SWANLAB_API_KEY"):
        root = os.environ.get("SWANLAB_ROOT") or os.environ.get("SWANLAB_SAVE_DIR") \
            or os.path.join(os.path.expanduser("~"), ".swanlab")
        if not os.path.isfile(os.path.join(root, ".netrc")):
            raise ConfigError(
                "trainer.logger has swanlab but no swanlab login was found (no SWANLAB_API_KEY, no "
                f"{os.path.join(root, '.netrc')}): set SWANLAB_API_KEY or run `swanlab login`, or set "
                "SWANLAB_MODE=offline (or local), or drop swanlab from trainer.logger."
            )


def wandb_run_id(run_dir: str, resume: bool) -> str:
    """The id kept in ``<run_dir>/wandb_run_id`` when the run resumes, else a new one, written there."""
    path = os.path.join(run_dir, WANDB_ID_FILE)
    if resume and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            kept = f.read().strip()
        if kept:
            return kept
    import uuid

    run_id = uuid.uuid4().hex[:8]
    os.makedirs(run_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(run_id + "\n")
    return run_id


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _columns(generations: list[dict[str, Any]]) -> list[str]:
    return ["step", *generations[0]]


def _table_rows(generations: list[dict[str, Any]], step: int) -> list[list[Any]]:
    return [[step, *g.values()] for g in generations]


class WandbLogger:
    """A Weights & Biases run ``project/experiment`` under ``<run_dir>/wandb`` (a resumed run continues it)."""

    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any], resume: bool = False):
        import wandb

        trainer = config.get("trainer", {})
        self.wandb = wandb
        self.run_id = wandb_run_id(run_dir, resume)
        self.run = wandb.init(project=project, name=experiment, config=config, dir=run_dir, id=self.run_id,
                              resume="allow", entity=trainer.get("wandb_entity"), group=trainer.get("wandb_group"),
                              tags=trainer.get("wandb_tags"))

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        row: dict[str, Any] = _numeric(metrics)
        if generations:
            row["val/generations"] = self.wandb.Table(columns=_columns(generations),
                                                      data=_table_rows(generations, step))
        self.run.log(row, step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardLogger:
    """TensorBoard event files; generations as a markdown table."""

    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        for key, value in _numeric(metrics).items():
            self.writer.add_scalar(key, value, step)
        if generations:
            columns = _columns(generations)[1:]
            lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
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
            table.add(_columns(generations), _table_rows(generations, step))
            row["val/generations"] = table
        self.swanlab.log(row, step=step)

    def close(self) -> None:
        self.swanlab.finish()


class MlflowLogger:
    """An MLflow run ``experiment`` in experiment ``project``."""

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
            self.client.log_dict(self.run_id, {"columns": _columns(generations),
                                               "data": _table_rows(generations, step)},
                                 f"val_generations/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
