"""The dashboard backends of ``trainer.logger``: Weights & Biases, TensorBoard, SwanLab, MLflow.

Each is an optional dependency (an extra: ``pip install 'easyrl[wandb]'``), checked when the config is loaded
(``easyrl.config.trainer.check_backends``). Each takes ``log(metrics, step, generations=None)``: flat ``group/name``
metrics, and on validation steps the first ``trainer.val_generations_to_log`` samples as rows
``{"prompt", "response", "ground_truth", "score"}``, logged as a table named ``val/generations``.

Where each writes, and the library's own switches (online/offline modes are the libraries' environment variables):

- wandb: ``<run_dir>/wandb``; ``WANDB_MODE=offline`` keeps the run on disk (``wandb sync`` uploads it later). The run
  id is kept in ``<run_dir>/wandb_run_id``, so a resumed run continues the same wandb run (``resume="allow"``);
  ``trainer.wandb_entity`` / ``wandb_group`` / ``wandb_tags`` set its team, group and tags.
- tensorboard: ``<run_dir>/tensorboard`` event files (generations as a text table).
- swanlab: ``<run_dir>/swanlog`` (``SWANLAB_LOGDIR`` overrides); ``SWANLAB_MODE=offline`` (sync later) or ``local``
  (needs ``swanlab[dashboard]``); default: SwanLab's own (cloud, after ``swanlab login``).
- mlflow: ``MLFLOW_TRACKING_URI`` if set, else a local file store ``<run_dir>/mlruns`` (``mlflow ui
  --backend-store-uri <run_dir>/mlruns``). MLflow 3 keeps its file store in maintenance mode and refuses it unless
  ``MLFLOW_ALLOW_FILE_STORE=true``, which is set for this local default only. The config is logged as
  ``config.json``, generations as ``val_generations/step_<step>.json``.
"""

from __future__ import annotations

import netrc
import os
import time
from typing import Any, Optional
from urllib.parse import urlparse

from easyrl.errors import ConfigError

WANDB_ID_FILE = "wandb_run_id"
_OFFLINE = ("offline", "dryrun", "disabled", "local")


def _netrc_has(host: str) -> bool:
    """Whether the netrc file (``NETRC``, else ``~/.netrc``) holds a login for ``host``."""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return os.path.isfile(path) and netrc.netrc(path).authenticators(host) is not None
    except (netrc.NetrcParseError, OSError):
        return False


def check_logger_credentials(trainer) -> None:
    """The online dashboards of ``trainer.logger`` have credentials, checked before any worker starts (a run would
    otherwise stop at its first log, or wait for a login prompt): wandb needs ``WANDB_API_KEY`` or a ``wandb login``
    (netrc entry for ``WANDB_BASE_URL``'s host, default api.wandb.ai) unless ``WANDB_MODE`` is offline/disabled;
    swanlab needs ``SWANLAB_API_KEY`` or a ``swanlab login`` (``~/.swanlab/.netrc``) unless ``SWANLAB_MODE`` is
    offline/local/disabled. MLflow and TensorBoard write local files by default.

    Raises:
        ConfigError: naming the backend, the variable to set and the offline switch.
    """
    backends = trainer.logger
    if "wandb" in backends and os.environ.get("WANDB_MODE", "").lower() not in _OFFLINE \
            and os.environ.get("WANDB_DISABLED", "").lower() not in ("true", "1") \
            and not os.environ.get("WANDB_API_KEY"):
        host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
        if not _netrc_has(host):
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
    """The wandb run id of the run folder ``run_dir``: the one kept in ``<run_dir>/wandb_run_id`` when the run
    resumes (so its steps continue the same wandb run), else a new one, written there."""
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
    """``step`` and the generations' own keys (``prompt``, ``response``, ``ground_truth``, ``score``, and
    ``judge_verdict`` in a judged run: ``easyrl.trainer.metrics.generation_rows``)."""
    return ["step", *generations[0]]


def _table_rows(generations: list[dict[str, Any]], step: int) -> list[list[Any]]:
    return [[step, *g.values()] for g in generations]


class WandbLogger:
    """A Weights & Biases run ``project/experiment`` with the whole config, under ``<run_dir>/wandb``; its id is kept
    in ``<run_dir>/wandb_run_id`` (:func:`wandb_run_id`), so a resumed run (``resume``) continues it. Entity, group
    and tags come from ``config["trainer"]`` (``wandb_entity``, ``wandb_group``, ``wandb_tags``)."""

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
    """TensorBoard event files under ``<run_dir>/tensorboard``; generations as a markdown table (text plugin)."""

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
            self.client.log_dict(self.run_id, {"columns": _columns(generations),
                                               "data": _table_rows(generations, step)},
                                 f"val_generations/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
