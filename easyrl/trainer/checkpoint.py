"""Checkpoint folders under ``trainer.save_checkpoint_path``: names, the tracker, atomic commits (written as
``.global_step_N.tmp``, renamed when complete), retention; ``manifest.json`` (the run's identity and every file's
size), written last and checked at resume before any worker loads; :class:`Checkpointer`, the trainer's part that
saves and restores the training state; and :func:`export_checkpoint`, a Hugging Face folder from a checkpoint without
Ray (LoRA merged, the base model's dtype, complete or not at all). Layout and guarantees: docs/checkpoints.md."""

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
from easyrl.models.hf_folder import write_hf_folder

logger = logging.getLogger("easyrl.checkpoint")

TRACKER = "checkpoint_tracker.json"
TRAINER_STATE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir_name(step: int) -> str:
    """``global_step_<step>``: the folder of the checkpoint taken after ``step`` training steps."""
    return f"global_step_{step}"


def read_tracker(root: str) -> dict[str, Any]:
    """The tracker of checkpoint folder ``root`` (``{}`` when there is none); ``RunStateError`` (naming it) when it
    is not a file or not a JSON object."""
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
    """The folder of the last complete checkpoint under ``root`` as named by the tracker, or None; ``RunStateError``
    when the tracker is unreadable or names a missing folder."""
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


def checkpoints_to_delete(steps: list[int], newest: int, limit: int, best: Optional[int]) -> list[int]:
    """The steps retention removes, oldest first: all but the ``limit`` newest (``newest`` included) and ``best``,
    which is never removed; ``limit`` (``trainer.save_limit``) ``<= 0`` keeps everything."""
    if limit <= 0:
        return []
    older = sorted((s for s in steps if s < newest), reverse=True)
    doomed = older[max(limit - 1, 0):]
    return sorted(s for s in doomed if s != best)


def commit_checkpoint(root: str, step: int, write: Callable[[str], None], metric: Optional[float] = None,
                      metric_name: Optional[str] = None, mode: str = "max", save_limit: int = -1) -> str:
    """Write checkpoint ``step`` into ``root`` atomically (``write(tmp_dir)`` fills the empty ``tmp_dir``), record it
    in the tracker (best by ``metric`` of ``metric_name`` under ``mode`` ``max``/``min``; None: not ranked), then
    apply ``save_limit``. Returns ``<root>/global_step_<step>``. Raises ``RunStateError`` when writing fails with an
    ``OSError`` (also in a worker): the temporary folder is removed and the message names the last good checkpoint.
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
        best = tracker.get("best_metric_value")
        if metric is not None and (best is None or (metric > best if mode == "max" else metric < best)):
            tracker.update(best_global_step=step, best_metric=metric_name, best_metric_value=metric)
        path = os.path.join(root, TRACKER)
        with open(f"{path}.tmp", "w", encoding="utf-8") as f:
            json.dump(tracker, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(f"{path}.tmp", path)
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
    """Saves and restores every worker's shards and the driver's state (``trainer_state.pt``); owns ``last``, this
    run's newest checkpoint. ``config``: the ``trainer`` section; ``identity``: ``run_identity``
    (None: no manifest written or checked)."""

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
        """Save the state after ``step`` (``driver_state`` as ``trainer_state.pt``; ``metrics`` rank it by
        ``trainer.best_metric``); returns the checkpoint folder."""
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
        """Restore every worker's shards from ``path``; returns the driver's saved state. ``RunStateError`` before
        any worker loads when the checkpoint is truncated or does not fit this run (``check_checkpoint``)."""
        from easyrl.workers.fsdp_worker import FSDPWorker

        if self.identity is not None:
            check_checkpoint(path, self.identity)
        self.workers.run_all(FSDPWorker.load_checkpoint, path)
        self.last = path
        return torch.load(os.path.join(path, TRAINER_STATE), weights_only=False)


MANIFEST = "manifest.json"
OPTIMIZER = "AdamW"  # the one easyrl builds (workers/policy.py, workers/critic.py)
MODEL_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size")
_SETTINGS = {  # manifest key -> how the message names it
    "world_size": "ranks (trainer.nnodes * trainer.n_gpus_per_node)",
    "optimizer": "optimizer",
    "actor_lora_rank": "worker.actor.model.lora.rank (which parameters the optimizer holds)",
    "critic": "a critic (algorithm.adv_estimator=gae)",
}


def model_fingerprint(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The :data:`MODEL_KEYS` entries of a ``config.json`` dict (its ``text_config`` fills what the top lacks)."""
    text = hf_config.get("text_config") or {}
    found = {key: hf_config.get(key, text.get(key)) for key in MODEL_KEYS}
    return {key: value for key, value in found.items() if value is not None}


def run_identity(config) -> dict[str, Any]:
    """This run's ranks, optimizer, LoRA rank, critic and model fingerprint (``worker.actor.model.model_path``)."""
    from transformers import AutoConfig

    model = config.worker.actor.model
    hf_config = AutoConfig.from_pretrained(model.model_path, trust_remote_code=model.trust_remote_code).to_dict()
    return {"world_size": config.world_size, "optimizer": OPTIMIZER, "actor_lora_rank": model.lora.rank,
            "critic": config.algorithm.needs_critic, "model": model_fingerprint(hf_config)}


def write_manifest(folder: str, identity: dict[str, Any]) -> None:
    """Write ``<folder>/manifest.json``: ``identity`` and the size of every file written so far (call it last)."""
    sizes = {os.path.relpath(os.path.join(root, name), folder): os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(folder) for name in names}
    sizes.pop(MANIFEST, None)
    with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
        json.dump({**identity, "files": dict(sorted(sizes.items()))}, f, indent=1)


def mismatches(saved: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """One phrase per difference between the manifest ``saved`` and ``expected`` (``run_identity``); keys missing on
    either side are not compared."""
    found = []
    for key, label in _SETTINGS.items():
        if key in saved and key in expected and saved[key] != expected[key]:
            found.append(f"saved with {label} = {saved[key]}, this run has {expected[key]}")
    model_saved, model_now = saved.get("model", {}), expected.get("model", {})
    for key in MODEL_KEYS:
        if key in model_saved and key in model_now and model_saved[key] != model_now[key]:
            found.append(f"saved from a model with {key}={model_saved[key]}, this run's model "
                         f"(worker.actor.model.model_path) has {key}={model_now[key]}")
    return found


def check_checkpoint(folder: str, identity: dict[str, Any]) -> None:
    """Refuse checkpoint ``folder`` with a missing or truncated file, or written by a run that does not fit
    ``identity`` (:func:`run_identity`): ``RunStateError`` naming the files or the mismatch."""
    path = os.path.join(folder, MANIFEST)
    saved: dict[str, Any] = {}
    if not os.path.isfile(path):  # written without a manifest: the files every rank reads, sizes unknown
        ranks = range(identity.get("world_size", 1))
        needed = [os.path.join("actor", ".metadata"), "trainer_state.pt", *(f"extra_state_rank_{r}.pt" for r in ranks)]
        if identity.get("critic"):
            needed += [os.path.join("critic", ".metadata"),
                       *(os.path.join("critic", f"extra_state_rank_{r}.pt") for r in ranks)]
        files = dict.fromkeys(needed)
    else:
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RunStateError(f"{path} is not valid JSON ({err}): the checkpoint {folder} is damaged. Resume from "
                                "another one (trainer.load_checkpoint_path=<folder>/global_step_M).") from None
        files = saved.get("files", {})
    damaged = []
    for rel, size in files.items():
        file = os.path.join(folder, rel)
        if not os.path.isfile(file):
            damaged.append(f"{file} is missing")
        elif size is not None and os.path.getsize(file) != size:
            damaged.append(f"{file} holds {os.path.getsize(file)} of its {size} bytes")
    if damaged:
        raise RunStateError(f"checkpoint {folder} is incomplete: {'; '.join(damaged)}. Restore the files, or resume "
                            "from an earlier checkpoint (trainer.load_checkpoint_path=<folder>/global_step_M).")
    different = mismatches(saved, identity)
    if different:
        raise RunStateError(
            f"checkpoint {folder} ({path}) does not fit this run: {'; '.join(different)}. Resume it with the settings "
            "it was saved with, or start a new run: another trainer.experiment_name (or trainer.save_checkpoint_path)."
        )


def load_checkpoint_weights(actor_dir: str) -> dict[str, torch.Tensor]:
    """The actor's full float32 weights from the DCP shards in ``actor_dir`` (no process group, no optimizer)."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(actor_dir).read_metadata()
    state = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and hasattr(meta, "size"):
            state[key[len("model."):]] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    dcp.load({"model": state}, checkpoint_id=actor_dir, no_dist=True)
    return state


def resolve_checkpoint(path: str) -> str:
    """The ``global_step_N`` folder of ``path`` (itself, its ``actor`` folder, or a run's checkpoint folder: its
    last); ``FileNotFoundError`` when there is none."""
    path = os.path.abspath(path)
    if os.path.basename(path) == "actor":
        path = os.path.dirname(path)
    if os.path.isfile(os.path.join(path, "actor", ".metadata")):
        return path
    last = find_last_checkpoint(path) if os.path.isdir(path) else None
    if last is None:
        raise FileNotFoundError(f"{path} is not a checkpoint (no actor/.metadata) nor a checkpoint folder with a "
                                f"checkpoint_tracker.json")
    return last


def export_checkpoint(checkpoint: str, out: str, dtype: Optional[torch.dtype] = None) -> str:
    """Write the Hugging Face folder ``out`` (must not exist; returned) from ``checkpoint`` (as
    :func:`resolve_checkpoint`, ``FileNotFoundError`` when none); ``dtype`` None keeps the base model's."""
    step_dir = resolve_checkpoint(checkpoint)
    actor_dir = os.path.join(step_dir, "actor")
    state = load_checkpoint_weights(actor_dir)
    hf_dir = os.path.join(actor_dir, "huggingface")
    state = merge_lora_checkpoint(state, hf_dir)
    return write_hf_folder(state, [hf_dir], out, dtype)


def merge_lora_checkpoint(state: dict[str, torch.Tensor], hf_dir: str) -> dict[str, torch.Tensor]:
    """A LoRA actor's weights merged (``W + lora_alpha / r * B @ A``, scale from ``hf_dir``'s
    ``adapter_config.json``, else ``FileNotFoundError``); ``state`` itself without an adapter."""
    from easyrl.models.lora import is_adapter_key, merge_lora_stream

    if not any(is_adapter_key(name) for name in state):
        return state
    path = os.path.join(hf_dir, "adapter_config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the checkpoint holds a LoRA adapter but {path} is missing (its scale is needed)")
    with open(path, encoding="utf-8") as f:
        adapter = json.load(f)
    return dict(merge_lora_stream(state.items(), adapter["lora_alpha"] / adapter["r"]))
