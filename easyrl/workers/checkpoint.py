"""One rank's part of a checkpoint: the FSDP2 actor's model and optimizer shards through
``torch.distributed.checkpoint`` (DCP), and the rank's own state (LR scheduler, update counters, RNG states).

Every rank calls :func:`save_actor` / :func:`load_actor` together (DCP coordinates over the default process group;
each rank writes and reads only its shards, and a checkpoint loads onto any number of ranks). The folder layout is
described in ``easyrl.trainer.checkpoint``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from easyrl.export import copy_hf_files
from easyrl.trainer.checkpoint import get_rng_state, set_rng_state

ACTOR_DIR = "actor"
HF_DIR = "huggingface"  # inside ACTOR_DIR: config, generation config, tokenizer/processor (no weights)


def extra_state_file(rank: int) -> str:
    """``extra_state_rank_<rank>.pt``."""
    return f"extra_state_rank_{rank}.pt"


def save_actor(policy, path: str, rank: int) -> None:
    """Write the actor's shards to ``<path>/actor`` and this rank's extra state to ``<path>/extra_state_rank_R.pt``.

    Args:
        policy: the trainable ``FSDPPolicy`` (``model``, ``optimizer``, ``lr_scheduler``, ``num_updates``,
            ``consecutive_skips``).
        path: the (temporary) checkpoint folder, on a file system every rank sees.
        rank: this worker's rank.
    """
    model_state, optim_state = get_state_dict(policy.model, policy.optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=os.path.join(path, ACTOR_DIR))
    extra = {"lr_scheduler": policy.lr_scheduler.state_dict(), "num_updates": policy.num_updates,
             "consecutive_skips": policy.consecutive_skips, "rng": get_rng_state()}
    torch.save(extra, os.path.join(path, extra_state_file(rank)))


def load_actor(policy, path: str, rank: int) -> None:
    """Restore what :func:`save_actor` wrote (model and optimizer resharded to this run's ranks).

    Raises:
        FileNotFoundError: the checkpoint has no shards or no extra state for this rank (e.g. saved with fewer
            ranks; the model and optimizer reshard, but the per-rank RNG states do not).
    """
    actor_dir = os.path.join(path, ACTOR_DIR)
    extra_path = os.path.join(path, extra_state_file(rank))
    for needed in (os.path.join(actor_dir, ".metadata"), extra_path):
        if not os.path.exists(needed):
            raise FileNotFoundError(f"rank {rank}: checkpoint {path} lacks {needed}; was it written by a run with "
                                    f"as many ranks as this one (trainer.nnodes * trainer.n_gpus_per_node)?")
    model_state, optim_state = get_state_dict(policy.model, policy.optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=actor_dir)
    set_state_dict(policy.model, policy.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    extra: dict[str, Any] = torch.load(extra_path, weights_only=False)
    policy.lr_scheduler.load_state_dict(extra["lr_scheduler"])
    policy.num_updates = extra["num_updates"]
    policy.consecutive_skips = extra["consecutive_skips"]
    set_rng_state(extra["rng"])


def save_hf_metadata(model_path: str, tokenizer_path: str, path: str, lora: Any = None) -> None:
    """Copy the base model's small Hugging Face files (config, generation config, tokenizer/processor; no weights)
    byte for byte to ``<path>/actor/huggingface``, so that ``easyrl.export`` needs nothing but the checkpoint; with
    ``lora`` (``worker.actor.model.lora``) also peft's ``adapter_config.json`` (export merges the adapter with it).
    Call it on one rank."""
    out = os.path.join(path, ACTOR_DIR, HF_DIR)
    copy_hf_files(dict.fromkeys((model_path, tokenizer_path)), out)
    if lora is not None:
        from easyrl.models.lora import peft_config

        peft_config(lora).save_pretrained(out)
