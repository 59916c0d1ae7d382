"""The run folder, ``<runs_root>/<project_name>/<experiment_name>``: which checkpoint a run resumes from, and the
refusal of a folder that belongs to another run (its ``metrics.jsonl`` or its checkpoints), before any worker starts.

A run never overwrites another: a new run refuses a folder holding another run's metrics or checkpoints; a run that
finds its own last checkpoint (``trainer.find_last_checkpoint``) resumes it.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

from easyrl.errors import RunStateError
from easyrl.trainer.checkpoint import TRAINER_STATE, find_last_checkpoint, read_tracker
from easyrl.trainer.checkpoint_manifest import check_checkpoint, run_identity

logger = logging.getLogger("easyrl.checkpoint")

METRICS_FILE = "metrics.jsonl"


def refuse_existing_metrics(path: str) -> None:
    """Refuse a metrics file that already holds rows (a new run would append to another run's metrics).

    Args:
        path: a ``metrics.jsonl``.

    Raises:
        RunStateError: ``path`` exists and is not empty.
    """
    if os.path.exists(path) and os.path.getsize(path) > 0:
        raise RunStateError(
            f"{path} holds the metrics of another run and there is no checkpoint to resume it from. A run never "
            f"overwrites another: choose a new trainer.experiment_name (or trainer.runs_root), or move the old "
            f"folder away."
        )


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
    :func:`refuse_existing_metrics`).

    Args:
        trainer: the ``trainer`` config section.

    Raises:
        RunStateError: as described there.
    """
    if checkpoint_to_resume(trainer) is None and "jsonl" in trainer.logger:
        refuse_existing_metrics(os.path.join(trainer.run_dir, METRICS_FILE))


def check_resumable(config) -> None:
    """The checkpoint this run would resume from (if any) is complete and fits this run (model, ranks, optimizer;
    ``easyrl.trainer.checkpoint_manifest.check_checkpoint``), checked before Ray starts.

    Args:
        config: the whole ``PPOConfig``.

    Raises:
        RunStateError: naming the file or the mismatch.
    """
    path = checkpoint_to_resume(config.trainer)
    if path is not None:
        check_checkpoint(path, run_identity(config))
