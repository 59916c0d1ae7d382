"""One rank's part of a checkpoint: the FSDP2 actor's (and critic's) model and optimizer shards through
``torch.distributed.checkpoint`` (DCP; loads onto any number of ranks), and the rank's own state (LR schedules,
counters, RNG states). Every rank calls together. Folder layout: ``easyrl.trainer.checkpoint``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                     set_state_dict)

from easyrl.models.hf_folder import copy_hf_files
from easyrl.rng import get_rng_state, set_rng_state

ACTOR_DIR = "actor"
CRITIC_DIR = "critic"
HF_DIR = "huggingface"  # inside ACTOR_DIR: config, generation config, tokenizer/processor (no weights)
MISSING_HINT = {  # what a checkpoint that lacks a role's files for this rank means
    ACTOR_DIR: "was it written by a run with as many ranks as this one (trainer.nnodes * trainer.n_gpus_per_node)?",
    CRITIC_DIR: "this run trains a critic (algorithm.adv_estimator=gae): resume from a checkpoint of a run with a "
                "critic and as many ranks, or start a new run (another trainer.experiment_name).",
}


def extra_state_file(rank: int, role: str = ACTOR_DIR) -> str:
    """The rank's own state of ``role`` that DCP does not hold: ``extra_state_rank_<rank>.pt`` (the actor's, with
    the rank's RNG states) or ``critic/extra_state_rank_<rank>.pt``."""
    name = f"extra_state_rank_{rank}.pt"
    return name if role == ACTOR_DIR else os.path.join(role, name)


def _training_state(model) -> dict[str, Any]:
    """The rank's own state of a trained model (``FSDPPolicy`` or ``FSDPCritic``) that DCP does not hold."""
    return {"lr_scheduler": model.lr_scheduler.state_dict(), "num_updates": model.num_updates,
            "consecutive_skips": model.consecutive_skips}


def _load_training_state(model, state: dict[str, Any]) -> None:
    model.lr_scheduler.load_state_dict(state["lr_scheduler"])
    model.num_updates = state["num_updates"]
    model.consecutive_skips = state["consecutive_skips"]


def _save_shards(model, folder: str, model_only: bool = False) -> None:
    """DCP shards of the model and (unless ``model_only``: ``trainer.save_model_only``) its optimizer states."""
    if model_only:
        dcp.save({"model": get_model_state_dict(model.model)}, checkpoint_id=folder)
        return
    model.optimizer_to(model.torch_device)
    model_state, optim_state = get_state_dict(model.model, model.optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder)
    model.optimizer_to("cpu")


def _load_shards(model, folder: str) -> None:
    """Restore :func:`_save_shards`' model (and optimizer states, when the checkpoint holds them: a model-only
    checkpoint leaves the optimizer fresh)."""
    if not holds_optimizer(folder):
        state = {"model": get_model_state_dict(model.model)}
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(model.model, state["model"])
        return
    model.optimizer_to(model.torch_device)
    model_state, optim_state = get_state_dict(model.model, model.optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model.model, model.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    model.optimizer_to("cpu")


def holds_optimizer(folder: str) -> bool:
    """Whether the DCP checkpoint in ``folder`` holds optimizer states (not one saved with
    ``trainer.save_model_only``)."""
    metadata = dcp.FileSystemReader(folder).read_metadata()
    return any(key.startswith("optimizer") for key in metadata.state_dict_metadata)


def save_role(model, path: str, rank: int, role: str = ACTOR_DIR, model_only: bool = False) -> None:
    """Write a trained role's shards (``role``: ``actor`` or ``critic``, the critic's with its value head) to
    ``<path>/<role>`` (a file system every rank sees) and this rank's :func:`extra_state_file` (LR schedule,
    counters; the actor's also the RNG states); ``model_only``: no optimizer states. Every rank calls it."""
    _save_shards(model, os.path.join(path, role), model_only)
    extra = {**_training_state(model), **({"rng": get_rng_state()} if role == ACTOR_DIR else {})}
    torch.save(extra, os.path.join(path, extra_state_file(rank, role)))


def load_role(model, path: str, rank: int, role: str = ACTOR_DIR) -> None:
    """Restore what :func:`save_role` wrote (model and optimizer resharded to this run's ranks). Raises
    ``FileNotFoundError`` without shards or extra state of ``role`` for this rank (per-rank RNG states do not
    reshard; a run without ``gae`` has no critic)."""
    folder, extra_path = os.path.join(path, role), os.path.join(path, extra_state_file(rank, role))
    for item in (os.path.join(folder, ".metadata"), extra_path):
        if not os.path.exists(item):
            raise FileNotFoundError(f"rank {rank}: checkpoint {path} lacks {item}; {MISSING_HINT[role]}")
    _load_shards(model, folder)
    extra: dict[str, Any] = torch.load(extra_path, weights_only=False)
    _load_training_state(model, extra)
    if role == ACTOR_DIR:
        set_rng_state(extra["rng"])


def save_hf_metadata(model_path: str, tokenizer_path: str, path: str, lora: Any = None) -> None:
    """Copy the base model's small Hugging Face files (config, generation config, tokenizer; no weights) to
    ``<path>/actor/huggingface`` so ``easyrl.export`` needs only the checkpoint; with ``lora`` also peft's
    ``adapter_config.json``. Call it on one rank."""
    out = os.path.join(path, ACTOR_DIR, HF_DIR)
    copy_hf_files(dict.fromkeys((model_path, tokenizer_path)), out)
    if lora is not None:
        from easyrl.models.lora import peft_config

        peft_config(lora).save_pretrained(out)
