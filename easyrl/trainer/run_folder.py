"""The run folder, ``<runs_root>/<project_name>/<experiment_name>``, before any worker starts: which checkpoint a run
resumes from (``trainer.resume_mode``), and the refusal of another run's folder, of a changed config
(``easyrl.config.rerun``) or of a finished run (docs/checkpoints.md, "Resume")."""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Optional

from easyrl.config import PPOConfig, valid_keys
from easyrl.config.rerun import training_changes
from easyrl.errors import RunStateError
from easyrl.trainer.checkpoint import (TRAINER_STATE, Checkpointer, check_checkpoint, find_last_checkpoint,
                                       read_tracker, run_identity)

logger = logging.getLogger("easyrl.checkpoint")

METRICS_FILE = "metrics.jsonl"
_RESUMED_CONFIG = re.compile(r"^config_resume_step_(\d+)\.yaml$")


class RunFinished(Exception):
    """The run folder's last checkpoint is at this run's last step: not an error, the command says so and exits 0."""


def resume_mode(trainer) -> str:
    """``trainer.resume_mode`` with the older switches mapped onto it: ``auto`` with ``load_checkpoint_path`` set is
    ``resume_path``, ``auto`` with ``find_last_checkpoint: false`` is ``disable``."""
    mode = getattr(trainer, "resume_mode", "auto")
    if mode == "auto" and trainer.load_checkpoint_path is not None:
        return "resume_path"
    if mode == "auto" and not trainer.find_last_checkpoint:
        return "disable"
    return mode


def refuse_existing_metrics(path: str) -> None:
    """``RunStateError`` when the ``metrics.jsonl`` of a new run already holds rows (another run's)."""
    if os.path.exists(path) and os.path.getsize(path) > 0:
        raise RunStateError(
            f"{path} holds the metrics of another run and there is no checkpoint to resume it from. A run never "
            f"overwrites another: choose a new trainer.experiment_name (or trainer.runs_root), or move the old "
            f"folder away."
        )


def checkpoint_to_resume(trainer) -> Optional[str]:
    """The checkpoint a run resumes from: ``trainer.load_checkpoint_path`` (``resume_path``), else the last one
    under ``trainer.save_checkpoint_path`` (``auto``, ``force``), else None (a new run). ``RunStateError`` when
    ``load_checkpoint_path`` is incomplete, or, not resuming, the folder holds another run's checkpoints."""
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


def refuse_changed_config(trainer, checkpoint: str, new_config: dict[str, Any]) -> None:
    """``RunStateError`` naming every key (old -> new) when ``new_config`` (a nested dict) trains differently from
    the config ``checkpoint`` was saved with: the latest ``config_resume_step_M.yaml`` with ``M`` up to its step, else
    ``config.yaml``."""
    from omegaconf import OmegaConf

    step = Checkpointer.step_of(checkpoint)
    run_dir = trainer.run_dir
    resumed = {int(m.group(1)): name for name in (os.listdir(run_dir) if os.path.isdir(run_dir) else [])
               if (m := _RESUMED_CONFIG.match(name)) and int(m.group(1)) <= step}
    path = os.path.join(run_dir, resumed[max(resumed)] if resumed else "config.yaml")
    if not os.path.isfile(path):
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
    """The checkpoint the run resumes from (None: a new run), after the refusals above; ``new_config`` (None: not
    compared) is compared in ``resume_mode=auto``, ``training_steps`` (None: not checked) finds a finished run.
    Raises ``RunStateError`` as the functions above, ``RunFinished`` as :func:`check_finished`."""
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
    """``RunFinished`` when ``resume_from`` (None: a new run) is at step ``training_steps`` (None: not checked) or
    later."""
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
    """The checkpoint this run would resume from (if any) is complete and fits it (``check_checkpoint``)."""
    path = checkpoint_to_resume(config.trainer)
    if path is not None:
        check_checkpoint(path, run_identity(config))
