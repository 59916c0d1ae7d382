"""The run folder, ``<runs_root>/<project_name>/<experiment_name>``: which checkpoint a run resumes from, and the
refusal of a folder that belongs to another run (its ``metrics.jsonl`` or its checkpoints), before any worker starts.

A run never overwrites another: a new run refuses a folder holding another run's metrics or checkpoints; a run that
finds its own last checkpoint resumes it (``trainer.resume_mode``, verl's names: ``auto``, ``disable``, ``force``,
``resume_path``). In ``auto`` mode it first compares the folder's saved config (``config.yaml``, or the
``config_resume_step_N.yaml`` of the latest resume, written by ``RayPPOTrainer.fit``) with the new one, and refuses a
change to a key that alters training (``easyrl.config.rerun``); a run whose checkpoint is at its last step is
finished (:class:`RunFinished`): nothing is trained or exported again.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Optional

from easyrl.config import PPOConfig, valid_keys
from easyrl.config.rerun import training_changes
from easyrl.errors import RunStateError
from easyrl.trainer.checkpoint import TRAINER_STATE, Checkpointer, find_last_checkpoint, read_tracker
from easyrl.trainer.checkpoint_manifest import check_checkpoint, run_identity

logger = logging.getLogger("easyrl.checkpoint")

METRICS_FILE = "metrics.jsonl"
_RESUMED_CONFIG = re.compile(r"^config_resume_step_(\d+)\.yaml$")


class RunFinished(Exception):
    """The run folder's last checkpoint is at this run's last step: nothing to train or export (not an error; the
    command says so and exits with status 0). The message says where the model is and how to train further."""


def resume_mode(trainer) -> str:
    """``trainer.resume_mode`` with EasyR1's switches mapped onto it: ``auto`` with ``load_checkpoint_path`` set is
    ``resume_path``, ``auto`` with ``find_last_checkpoint: false`` is ``disable``."""
    mode = getattr(trainer, "resume_mode", "auto")
    if mode == "auto" and trainer.load_checkpoint_path is not None:
        return "resume_path"
    if mode == "auto" and not trainer.find_last_checkpoint:
        return "disable"
    return mode


def refuse_existing_metrics(path: str) -> None:
    """Refuse a ``metrics.jsonl`` that already holds rows (a new run would append to another run's metrics).

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
    """Which checkpoint a run resumes from (:func:`resume_mode`): ``trainer.load_checkpoint_path`` (``resume_path``),
    else the last one under ``trainer.save_checkpoint_path`` (``auto``, ``force``), else None (a new run;
    ``disable``).

    Raises:
        RunStateError: ``load_checkpoint_path`` is not a complete checkpoint; or, not resuming, the checkpoint
            folder already holds another run's checkpoints (they would be overwritten).
    """
    root = trainer.save_checkpoint_path
    mode = resume_mode(trainer)
    if mode == "resume_path":
        path = trainer.load_checkpoint_path
        if not os.path.isfile(os.path.join(path, TRAINER_STATE)):
            raise RunStateError(f"trainer.load_checkpoint_path={path} is not a complete checkpoint (no "
                                f"{TRAINER_STATE}); give a global_step_N folder.")
        return path
    last = find_last_checkpoint(root) if mode != "disable" else None
    if last is None and read_tracker(root):
        raise RunStateError(
            f"{root} holds checkpoints of an earlier run (checkpoint_tracker.json) and trainer.resume_mode=disable "
            f"(or trainer.find_last_checkpoint=false): resume it, or choose another trainer.experiment_name or "
            f"trainer.save_checkpoint_path (a run never overwrites another's checkpoints)."
        )
    if last is not None:
        logger.info("resuming from %s (a new trainer.experiment_name starts afresh)", last)
    return last


def saved_config_path(run_dir: str, step: int) -> Optional[str]:
    """The config the run folder ``run_dir`` trained with up to checkpoint step ``step``: the
    ``config_resume_step_M.yaml`` of the latest resume at ``M <= step``, else ``config.yaml``; None if neither is
    there (a folder of an older easyrl)."""
    resumed = {int(m.group(1)): name for name in (os.listdir(run_dir) if os.path.isdir(run_dir) else [])
               if (m := _RESUMED_CONFIG.match(name))}
    earlier = [m for m in resumed if m <= step]
    name = resumed[max(earlier)] if earlier else "config.yaml"
    path = os.path.join(run_dir, name)
    return path if os.path.isfile(path) else None


def refuse_changed_config(trainer, checkpoint: str, new_config: dict[str, Any]) -> None:
    """Refuse to resume ``checkpoint`` (a ``global_step_N`` folder) with a config (``new_config``, the whole config as
    a nested dict) that trains differently from the one it was saved with.

    Raises:
        RunStateError: naming every differing key with its old and new value, and the two ways out: a new
            ``trainer.experiment_name``, or ``trainer.resume_mode=force``.
    """
    from omegaconf import OmegaConf

    step = Checkpointer.step_of(checkpoint)
    path = saved_config_path(trainer.run_dir, step)
    if path is None:
        logger.warning("%s has no saved config to compare with: resuming %s as it is", trainer.run_dir, checkpoint)
        return
    saved = OmegaConf.to_container(OmegaConf.load(path))
    free_dicts = tuple(key for key, is_dict in valid_keys(PPOConfig).items() if is_dict)
    changes = training_changes(saved, new_config, free_dicts)
    if changes:
        listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changes)
        raise RunStateError(
            f"{trainer.run_dir} holds a run at step {step} that trained with other settings ({path}): {listed}. "
            f"Resuming it would mix two trainings: choose a new trainer.experiment_name to start a new run, or set "
            f"trainer.resume_mode=force to continue this one with the new settings."
        )


def check_run_folder(trainer, new_config: Optional[dict[str, Any]] = None,
                     training_steps: Optional[int] = None) -> Optional[str]:
    """Fail early, before any worker starts, if the run would be refused (see :func:`checkpoint_to_resume`,
    :func:`refuse_changed_config` and :func:`refuse_existing_metrics`), or is finished. ``new_config`` (None: not
    compared) is compared with the saved one in ``resume_mode=auto``; ``training_steps`` (None: not checked) is the
    run's number of steps. Returns the checkpoint the run resumes from, or None for a new run.

    Raises:
        RunStateError: as described there.
        RunFinished: the checkpoint to resume is at step ``training_steps`` or later.
    """
    resume_from = checkpoint_to_resume(trainer)
    if resume_from is None:
        if "jsonl" in trainer.logger:
            refuse_existing_metrics(os.path.join(trainer.run_dir, METRICS_FILE))
        return None
    if new_config is not None and resume_mode(trainer) == "auto":
        refuse_changed_config(trainer, resume_from, new_config)
    check_finished(trainer, resume_from, training_steps)
    return resume_from


def check_finished(trainer, resume_from: Optional[str], training_steps: Optional[int]) -> None:
    """Stop at a finished run: the checkpoint ``resume_from`` (None: a new run) is at step ``training_steps`` (None: not
    checked) or later.

    Raises:
        RunFinished: naming the run folder, the step and what to do instead.
    """
    if resume_from is None or training_steps is None:
        return
    step = Checkpointer.step_of(resume_from)
    if step >= training_steps:
        model = trainer.save_model_path or os.path.join(trainer.run_dir, "huggingface")
        where = f"its model is in {model}" if os.path.isdir(model) else "it was not exported"
        raise RunFinished(
            f"{trainer.run_dir} is finished: its checkpoint {resume_from} is at step {step} of {training_steps}; "
            f"{where}. Nothing to do. To train further raise trainer.max_steps or trainer.total_epochs; to start a "
            f"new run choose a new trainer.experiment_name; to validate it: easyrl eval config=... model={resume_from}"
        )


def check_resumable(config) -> None:
    """The checkpoint this run would resume from (if any) is complete and fits this run (model, ranks, optimizer;
    ``easyrl.trainer.checkpoint_manifest.check_checkpoint``), checked before Ray starts.

    Raises:
        RunStateError: naming the file or the mismatch.
    """
    path = checkpoint_to_resume(config.trainer)
    if path is not None:
        check_checkpoint(path, run_identity(config))
