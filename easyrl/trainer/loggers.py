"""Where metrics go: the backends of ``trainer.logger`` (the console: a tqdm bar and one short line per step;
``<run_dir>/metrics.jsonl``; the dashboards: Weights & Biases, TensorBoard, SwanLab, MLflow, each an optional extra,
where each writes and its offline switch: docs/metrics.md), each given ``log(metrics, step, generations=None)`` with
flat ``group/name`` keys."""

from __future__ import annotations

import json
import logging
import math
import netrc
import os
import sys
import time
from typing import Any, Optional
from urllib.parse import urlparse

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from easyrl.config.trainer import check_backends
from easyrl.errors import ConfigError
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
    goes to the dashboards, ``total_steps`` and ``initial_step`` size the console's bar. Raises ``ConfigError`` (an
    unknown backend, a missing library) or ``RunStateError`` (a new run in a folder with another run's metrics)."""

    def __init__(self, backends: list[str], run_dir: str, project: str, experiment: str, config: dict[str, Any],
                 total_steps: Optional[int] = None, initial_step: int = 0, resume: bool = False):
        check_backends(backends)
        make = {"console": lambda: ConsoleLogger(total_steps, initial_step),
                "jsonl": lambda: JsonlLogger(os.path.join(run_dir, METRICS_FILE), resume=resume),
                "tensorboard": lambda: TensorBoardLogger(os.path.join(run_dir, "tensorboard")),
                "wandb": lambda: WandbLogger(run_dir, project, experiment, config, resume=resume),
                "swanlab": lambda: SwanlabLogger(run_dir, project, experiment, config),
                "mlflow": lambda: MlflowLogger(run_dir, project, experiment, config)}
        self.loggers = [make[name]() for name in backends]

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        """Send one step's metrics and validation generations (if any) to every backend."""
        for backend in self.loggers:
            backend.log(metrics, step, generations)

    def close(self) -> None:
        """Flush and close every backend."""
        for backend in self.loggers:
            backend.close()


WANDB_ID_FILE = "wandb_run_id"
# the modes in which each tracker writes to disk only (no login needed), as its own settings name them
LOCAL_MODES = {"wandb": ("offline", "dryrun", "disabled"), "swanlab": ("offline", "local", "disabled")}
MODE_VARIABLES = {"wandb": "WANDB_MODE", "swanlab": "SWANLAB_MODE"}
ON_WORDS = ("1", "true", "yes", "on", "y", "t")  # what wandb's own switches read as on (strtobool)


def tracker_mode(backend: str) -> str:
    """The mode ``backend`` (``wandb`` or ``swanlab``) will run in, read from the environment by the library's own
    settings as its ``init`` reads them (``wandb.Settings.update_from_env_vars``; ``swanlab.Settings()``, whose
    pydantic settings read ``SWANLAB_*``), e.g. ``"online"``.

    Raises:
        EnvValueError: a mode variable the library refuses (``WANDB_MODE=local``; both libraries compare it as
            written, so ``OFFLINE`` too), naming the values it takes, or another of its variables that it refuses;
            ``WANDB_DISABLED`` set to on in an online run: wandb does not read it (0.31), so the run would log
            online.
    """
    from pydantic import ValidationError

    from easyrl.envvars import ENVIRONMENT, EnvValueError

    variable = MODE_VARIABLES[backend]
    try:
        if backend == "swanlab":
            import swanlab

            return swanlab.Settings().mode
        import wandb

        settings = wandb.Settings()
        settings.update_from_env_vars(dict(os.environ))
        if settings.mode not in LOCAL_MODES["wandb"] and os.environ.get("WANDB_DISABLED", "").lower() in ON_WORDS:
            raise EnvValueError("WANDB_DISABLED", os.environ["WANDB_DISABLED"], ENVIRONMENT,
                                "read by wandb (it reads WANDB_MODE: this run would log online)",
                                "write WANDB_MODE=disabled (no logging) or WANDB_MODE=offline (on disk), or drop "
                                "wandb from trainer.logger")
        return settings.mode
    except ValidationError as err:
        error = err.errors()[0]
        field = "_".join(str(part) for part in error["loc"])
        if field != "mode":  # another of the library's variables that it refuses: named by its settings field
            raise EnvValueError(f"{backend}'s setting {field} (from a {variable.split('_')[0]}_* variable)",
                                str(error.get("input")), ENVIRONMENT, f"valid ({error['msg']})",
                                "fix or unset that variable") from None
        raise EnvValueError(variable, os.environ.get(variable, ""), ENVIRONMENT, f"a {backend} mode ({error['msg']})",
                            f"write e.g. {variable}=offline, or unset it (online)") from None


def check_logger_credentials(trainer) -> None:
    """Online wandb / swanlab in ``trainer.logger`` (:func:`tracker_mode`) have a login (an API key variable or a
    netrc entry), checked before any worker starts; else ``ConfigError`` naming the variable to set and the offline
    switch. Raises ``EnvValueError`` from :func:`tracker_mode`."""
    backends = trainer.logger
    check_backends(backends)  # installed, before their settings are read
    if "wandb" in backends and tracker_mode("wandb") not in LOCAL_MODES["wandb"] \
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
    if "swanlab" in backends and tracker_mode("swanlab") not in LOCAL_MODES["swanlab"] \
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
