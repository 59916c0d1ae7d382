"""Checkpoint folders of a run: names, the tracker file, atomic commits, retention, the driver's own state, and the
trainer's save/load (``CheckpointMixin``, a part of :class:`~easyrl.trainer.ray_trainer.RayPPOTrainer`).

Layout (EasyR1's names), under ``trainer.save_checkpoint_path`` (default: the run folder ``<runs_root>/<project_name>/
<experiment_name>``, next to ``metrics.jsonl``)::

    checkpoint_tracker.json       {"last_global_step": N, "best_global_step": M, "best_metric": ..., ...}
    global_step_N/
        actor/                    torch.distributed.checkpoint shards of the actor's model and optimizer (all ranks)
        actor/huggingface/        config, generation config, tokenizer/processor (no weights; for ``easyrl.export``)
        extra_state_rank_R.pt     per rank: LR scheduler, RNG states, update counters
        critic/                   with algorithm.adv_estimator=gae: the critic's DCP shards (model with its value
                                  head, optimizer) and critic/extra_state_rank_R.pt (its LR scheduler, counters)
        trainer_state.pt          the driver: global step, dataloader position, KL controller, RNG states

A checkpoint is written under ``.global_step_N.tmp`` and renamed to ``global_step_N`` only when every file is there;
the tracker is then replaced atomically (write + ``os.replace``). A crash at any moment leaves the tracker naming the
previous complete checkpoint, which is what a resume picks.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from typing import Any, Optional

import torch

from easyrl.errors import UserError
from easyrl.rng import get_rng_state, set_rng_state

logger = logging.getLogger("easyrl.checkpoint")

TRACKER = "checkpoint_tracker.json"
TRAINER_STATE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class RunStateError(UserError):
    """The run folder or checkpoint cannot be used as asked (another run's metrics or checkpoints, an incomplete
    checkpoint): the message says what to do. Printed by the CLI as ``easyrl: run error: ...`` (exit status 2)."""

    kind = "run"


def step_dir_name(step: int) -> str:
    """``global_step_<step>``: the folder of the checkpoint taken after ``step`` training steps."""
    return f"global_step_{step}"


def _write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_tracker(root: str) -> dict[str, Any]:
    """The tracker of checkpoint folder ``root`` (``{}`` when there is none).

    Raises:
        ValueError: the tracker exists but is not valid JSON (names the file).
    """
    path = os.path.join(root, TRACKER)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); set trainer.load_checkpoint_path to a "
                         f"global_step_N folder to resume from it explicitly.") from err


def find_last_checkpoint(root: str) -> Optional[str]:
    """The folder of the last complete checkpoint under ``root`` as named by the tracker, or None.

    Raises:
        FileNotFoundError: the tracker names a folder that does not exist (e.g. deleted by hand).
    """
    step = read_tracker(root).get("last_global_step")
    if step is None:
        return None
    path = os.path.join(root, step_dir_name(step))
    if not os.path.isfile(os.path.join(path, TRAINER_STATE)):
        raise FileNotFoundError(
            f"{os.path.join(root, TRACKER)} names step {step} but {path} is missing or incomplete; restore it, set "
            f"trainer.load_checkpoint_path to another global_step_N folder, or trainer.find_last_checkpoint=false "
            f"with a fresh trainer.experiment_name."
        )
    return path


def is_better(value: float, best: Optional[float], mode: str) -> bool:
    """Whether ``value`` beats ``best`` (None: nothing yet) under ``mode`` (``max`` or ``min``)."""
    if best is None:
        return True
    return value > best if mode == "max" else value < best


def checkpoints_to_delete(steps: list[int], newest: int, limit: int, best: Optional[int]) -> list[int]:
    """Which checkpoint steps retention removes: all but the ``limit`` newest (the one just saved, ``newest``,
    counts among them) and ``best``, which is never removed. ``limit <= 0`` keeps everything.

    Args:
        steps: the steps of the ``global_step_N`` folders present.
        newest: the step just saved.
        limit: ``trainer.save_limit``.
        best: the tracker's ``best_global_step`` (or None).

    Returns:
        The steps to delete, oldest first.
    """
    if limit <= 0:
        return []
    older = sorted((s for s in steps if s < newest), reverse=True)
    doomed = older[max(limit - 1, 0):]
    return sorted(s for s in doomed if s != best)


def commit_checkpoint(root: str, step: int, write: Callable[[str], None], metric: Optional[float] = None,
                      metric_name: Optional[str] = None, mode: str = "max", save_limit: int = -1) -> str:
    """Write a checkpoint atomically and record it in the tracker; then apply ``save_limit``.

    Args:
        root: the checkpoint folder of the run (``trainer.save_checkpoint_path``).
        step: global step of the checkpoint.
        write: ``write(tmp_dir)`` writes every file of the checkpoint into ``tmp_dir`` (which exists, empty).
        metric: this step's value of ``metric_name`` (the validation metric that ranks checkpoints) or None if it
            was not computed at this step.
        mode: ``max`` or ``min``: which direction of ``metric`` is better.
        save_limit: keep this many newest checkpoints (plus the best); ``<= 0`` keeps all.

    Returns:
        The final checkpoint folder ``<root>/global_step_<step>``.
    """
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, step_dir_name(step))
    tmp = os.path.join(root, f".{step_dir_name(step)}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was interrupted
    os.makedirs(tmp)
    write(tmp)
    if os.path.exists(final):  # written by a run that died after it and before the tracker named it: stale
        shutil.rmtree(final)
    os.rename(tmp, final)
    tracker = read_tracker(root)
    tracker["last_global_step"] = step
    if metric is not None and is_better(metric, tracker.get("best_metric_value"), mode):
        tracker.update(best_global_step=step, best_metric=metric_name, best_metric_value=metric)
    _write_json_atomic(os.path.join(root, TRACKER), tracker)
    present = [int(m.group(1)) for name in os.listdir(root) if (m := _STEP_DIR.match(name))]
    for old in checkpoints_to_delete(present, step, save_limit, tracker.get("best_global_step")):
        shutil.rmtree(os.path.join(root, step_dir_name(old)), ignore_errors=True)
        logger.info("save_limit=%d: removed %s", save_limit, step_dir_name(old))
    return final


def checkpoint_to_resume(trainer) -> Optional[str]:
    """Which checkpoint a run resumes from: ``trainer.load_checkpoint_path``, else the last one under
    ``trainer.save_checkpoint_path`` (if ``trainer.find_last_checkpoint``), else None (a new run).

    Args:
        trainer: the ``trainer`` config section.

    Raises:
        RunStateError: ``load_checkpoint_path`` is not a complete checkpoint; or, not resuming, the checkpoint
            folder already holds another run's checkpoints (they would be overwritten).
    """
    root = trainer.save_checkpoint_path
    if trainer.load_checkpoint_path is not None:
        path = trainer.load_checkpoint_path
        if not os.path.isfile(os.path.join(path, TRAINER_STATE)):
            raise RunStateError(f"trainer.load_checkpoint_path={path} is not a complete checkpoint (no "
                                f"{TRAINER_STATE}); give a global_step_N folder.")
        return path
    last = find_last_checkpoint(root) if trainer.find_last_checkpoint else None
    if last is None and read_tracker(root):
        raise RunStateError(
            f"{root} holds checkpoints of an earlier run (checkpoint_tracker.json) and trainer.find_last_checkpoint="
            f"false: resume it, or choose another trainer.experiment_name or trainer.save_checkpoint_path (a run "
            f"never overwrites another's checkpoints)."
        )
    if last is not None:
        logger.info("resuming from %s (trainer.find_last_checkpoint=false and a new experiment_name start afresh)",
                    last)
    return last


def check_run_folder(trainer) -> None:
    """Fail early, before any worker starts, if the run would be refused (see :func:`checkpoint_to_resume` and
    ``easyrl.trainer.loggers.JsonlLogger``).

    Raises:
        RunStateError: as described there.
    """
    from easyrl.trainer.loggers import refuse_existing_metrics

    if checkpoint_to_resume(trainer) is None and "jsonl" in trainer.logger:
        refuse_existing_metrics(os.path.join(trainer.run_dir, "metrics.jsonl"))


class CheckpointMixin:
    """The trainer's checkpoints: save/load the whole training state (the workers' shards and this process's state).
    Uses the trainer's ``config``, ``workers``, ``global_step``, ``train_dataloader``, ``kl_ctrl`` and
    ``last_checkpoint``."""

    @staticmethod
    def _step_of(path: str) -> int:
        return int(os.path.basename(os.path.normpath(path)).rsplit("_", 1)[-1])

    def _checkpoint_to_resume(self) -> Optional[str]:
        return checkpoint_to_resume(self.config.trainer)

    def save_checkpoint(self, metrics: Optional[dict[str, float]] = None) -> str:
        """Save the whole training state as ``global_step_<N>`` under ``trainer.save_checkpoint_path`` (atomic; see
        ``easyrl.trainer.checkpoint``) and apply ``trainer.save_limit``; ``metrics`` of this step rank it by
        ``trainer.best_metric``. Returns the checkpoint folder."""
        from easyrl.workers.fsdp_worker import FSDPWorker  # torch.distributed, tensordict: not for the path checks

        trainer = self.config.trainer

        def write(tmp: str) -> None:
            self.workers.run_all(FSDPWorker.save_checkpoint, tmp)
            torch.save(self.state_dict(), os.path.join(tmp, TRAINER_STATE))

        metric = (metrics or {}).get(trainer.best_metric)
        self.last_checkpoint = commit_checkpoint(
            trainer.save_checkpoint_path, self.global_step, write, metric=metric, metric_name=trainer.best_metric,
            mode=trainer.best_metric_mode, save_limit=trainer.save_limit,
        )
        logger.info("checkpoint saved: %s", self.last_checkpoint)
        return self.last_checkpoint

    def load_checkpoint(self, path: str) -> None:
        """Restore the training state saved by :meth:`save_checkpoint` (workers and this process)."""
        from easyrl.workers.fsdp_worker import FSDPWorker

        self.workers.run_all(FSDPWorker.load_checkpoint, path)
        self.load_state_dict(torch.load(os.path.join(path, TRAINER_STATE), weights_only=False))
        self.last_checkpoint = path
        logger.info("resumed from %s at step %d", path, self.global_step)

    def state_dict(self) -> dict[str, Any]:
        """This process's part of the training state: step, prompt-stream position, KL coefficient, RNG states."""
        return {"global_step": self.global_step, "prompt_stream": self.train_dataloader.state_dict(),
                "kl_coef": self.kl_ctrl.value, "rng": get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (before iterating over the prompts)."""
        self.global_step = state["global_step"]
        self.train_dataloader.load_state_dict(state["prompt_stream"])
        self.kl_ctrl.value = state["kl_coef"]
        set_rng_state(state["rng"])
