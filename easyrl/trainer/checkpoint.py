"""Checkpoint folders of a run: names, the tracker file, atomic commits, retention, and the trainer's part that saves
and restores the whole training state (:class:`Checkpointer`: the workers' shards and the driver's own state).

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
        manifest.json             written last: ranks, optimizer, model shape, every file's size
                                  (``easyrl.trainer.checkpoint_manifest``, checked before a resume loads anything)

A checkpoint is written under ``.global_step_N.tmp`` and renamed to ``global_step_N`` only when every file is there;
the tracker is then replaced atomically (write + ``os.replace``). A crash at any moment leaves the tracker naming the
previous complete checkpoint, which is what a resume picks. A save that fails (a full disk) removes its temporary
folder and ends the run with one line naming the last good checkpoint (:func:`commit_checkpoint`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from typing import Any, Optional

import torch

from easyrl.errors import RunStateError
from easyrl.trainer.checkpoint_manifest import check_checkpoint, write_manifest

logger = logging.getLogger("easyrl.checkpoint")

TRACKER = "checkpoint_tracker.json"
TRAINER_STATE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


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
        RunStateError: the tracker exists but is not a JSON object, or is not a file (names it).
    """
    path = os.path.join(root, TRACKER)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            tracker = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        tracker = err
    if not isinstance(tracker, dict) or not isinstance(tracker.get("last_global_step", 0), int):
        why = f" ({tracker})" if isinstance(tracker, Exception) else ""
        raise RunStateError(f"{path} is not a checkpoint tracker (a JSON object naming last_global_step){why}: it "
                            f"was cut or edited by hand. Fix it (e.g. {{\"last_global_step\": N}} for the last "
                            f"global_step_N folder under {root}), or set trainer.load_checkpoint_path to a "
                            "global_step_N folder to resume from it explicitly.")
    return tracker


def find_last_checkpoint(root: str) -> Optional[str]:
    """The folder of the last complete checkpoint under ``root`` as named by the tracker, or None.

    Raises:
        RunStateError: the tracker names a folder that does not exist (e.g. deleted by hand), or is unreadable.
    """
    step = read_tracker(root).get("last_global_step")
    if step is None:
        return None
    path = os.path.join(root, step_dir_name(step))
    if not os.path.isfile(os.path.join(path, TRAINER_STATE)):
        raise RunStateError(
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
    counts among them) and ``best`` (the tracker's ``best_global_step``), which is never removed. ``limit``
    (``trainer.save_limit``) ``<= 0`` keeps everything. Returns the steps to delete, oldest first.
    """
    if limit <= 0:
        return []
    older = sorted((s for s in steps if s < newest), reverse=True)
    doomed = older[max(limit - 1, 0):]
    return sorted(s for s in doomed if s != best)


def commit_checkpoint(root: str, step: int, write: Callable[[str], None], metric: Optional[float] = None,
                      metric_name: Optional[str] = None, mode: str = "max", save_limit: int = -1) -> str:
    """Write a checkpoint into ``root`` (``trainer.save_checkpoint_path``) atomically, record it in the tracker, then
    apply ``save_limit`` (:func:`checkpoints_to_delete`). ``write(tmp_dir)`` writes every file into the existing,
    empty ``tmp_dir``; ``metric`` is this step's value of ``metric_name`` (None: not computed), better when larger
    (``mode="max"``) or smaller (``"min"``). Returns ``<root>/global_step_<step>``.

    Raises:
        RunStateError: writing failed with an ``OSError`` (a full disk, a quota, a read-only folder; also inside a
            worker): the temporary folder is removed, the tracker still names the previous checkpoint, and the
            message names it.
    """
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, step_dir_name(step))
    tmp = os.path.join(root, f".{step_dir_name(step)}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was interrupted
    tracker = read_tracker(root)
    try:
        os.makedirs(tmp)
        write(tmp)
        if os.path.exists(final):  # written by a run that died after it and before the tracker named it: stale
            shutil.rmtree(final)
        os.rename(tmp, final)
        tracker["last_global_step"] = step
        if metric is not None and is_better(metric, tracker.get("best_metric_value"), mode):
            tracker.update(best_global_step=step, best_metric=metric_name, best_metric_value=metric)
        _write_json_atomic(os.path.join(root, TRACKER), tracker)
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)  # give the space back
        os_error = _os_error_in(err)
        if os_error is None:
            raise
        last = read_tracker(root).get("last_global_step")
        good = os.path.join(root, step_dir_name(last)) if last is not None else "none (no step saved yet)"
        hint = "free disk space" if os_error.errno in (errno.ENOSPC, errno.EDQUOT) else "fix the folder"
        raise RunStateError(
            f"saving checkpoint {step_dir_name(step)} under {root} failed ({os_error}); the last good checkpoint is "
            f"{good}. {hint.capitalize()} (or lower trainer.save_limit, or set trainer.save_checkpoint_path to "
            f"another disk), then run the same command again: it resumes from there."
        ) from err
    present = [int(m.group(1)) for name in os.listdir(root) if (m := _STEP_DIR.match(name))]
    for old in checkpoints_to_delete(present, step, save_limit, tracker.get("best_global_step")):
        shutil.rmtree(os.path.join(root, step_dir_name(old)), ignore_errors=True)
        logger.info("save_limit=%d: removed %s", save_limit, step_dir_name(old))
    return final


def _os_error_in(err: Optional[BaseException], depth: int = 0) -> Optional[OSError]:
    """The ``OSError`` behind ``err``: itself, a Ray task error's cause (``.cause``), one of a DCP
    ``CheckpointException``'s per-rank ``failures``, or an explicit ``raise ... from``."""
    if err is None or depth > 8:
        return None
    if isinstance(err, OSError):
        return err
    failures = getattr(err, "failures", None)
    for inner in failures.values() if isinstance(failures, dict) else ():
        if isinstance(inner, BaseException) and (found := _os_error_in(inner, depth + 1)) is not None:
            return found
    cause = getattr(err, "cause", None)
    return _os_error_in(cause if isinstance(cause, BaseException) else err.__cause__, depth + 1)


class Checkpointer:
    """Saves and restores the whole training state under ``trainer.save_checkpoint_path``: every worker's shards
    (``FSDPWorker.save_checkpoint`` / ``load_checkpoint``) and the driver's state (``trainer_state.pt``: what the
    trainer's ``state_dict`` returns). Owns ``last``, the newest complete checkpoint of this run. ``config`` is the
    ``trainer`` section; ``identity`` this run's ``checkpoint_manifest.run_identity`` (None: no manifest written or
    checked).
    """

    def __init__(self, config, workers, identity: Optional[dict[str, Any]] = None):
        self.config = config
        self.workers = workers
        self.identity = identity
        self.last: Optional[str] = None

    @staticmethod
    def step_of(path: str) -> int:
        """The global step of a ``global_step_N`` folder."""
        return int(os.path.basename(os.path.normpath(path)).rsplit("_", 1)[-1])

    def save(self, step: int, driver_state: dict[str, Any], metrics: Optional[dict[str, float]] = None) -> str:
        """Save the training state after ``step`` as ``global_step_<step>`` (atomic; see the module docstring) and
        apply ``trainer.save_limit``; ``driver_state`` is written as ``trainer_state.pt``, ``metrics`` of this step
        (None: not ranked) rank it by ``trainer.best_metric``. Returns the checkpoint folder.
        """
        from easyrl.workers.fsdp_worker import FSDPWorker

        cfg = self.config

        def write(tmp: str) -> None:
            self.workers.run_all(FSDPWorker.save_checkpoint, tmp)
            torch.save(driver_state, os.path.join(tmp, TRAINER_STATE))
            if self.identity is not None:
                write_manifest(tmp, self.identity)

        metric = (metrics or {}).get(cfg.best_metric)
        self.last = commit_checkpoint(cfg.save_checkpoint_path, step, write, metric=metric,
                                      metric_name=cfg.best_metric, mode=cfg.best_metric_mode,
                                      save_limit=cfg.save_limit)
        logger.info("checkpoint saved: %s", self.last)
        return self.last

    def load(self, path: str) -> dict[str, Any]:
        """Restore every worker's shards from checkpoint folder ``path``; returns the driver's state saved with it
        (for the trainer's ``load_state_dict``).

        Raises:
            RunStateError: the checkpoint is truncated or does not fit this run (``check_checkpoint``), before any
                worker loads from it.
        """
        from easyrl.workers.fsdp_worker import FSDPWorker

        if self.identity is not None:
            check_checkpoint(path, self.identity)
        self.workers.run_all(FSDPWorker.load_checkpoint, path)
        self.last = path
        return torch.load(os.path.join(path, TRAINER_STATE), weights_only=False)
