"""A Hugging Face folder from a training checkpoint, on one process without Ray (``easyrl export``, ``easyrl eval``
of a checkpoint): the actor's DCP shards read into full weights (a LoRA actor merged) and written by
``easyrl.models.hf_folder.write_hf_folder`` in the base model's dtype, complete or not at all."""

from __future__ import annotations

import json
import os
from typing import Optional

import torch

from easyrl.models.hf_folder import write_hf_folder
from easyrl.trainer.checkpoint import find_last_checkpoint


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
    """Write the Hugging Face folder ``out`` (must not exist; returned) from ``checkpoint``: a ``global_step_N``
    folder, its ``actor`` folder, or a run's checkpoint folder (its last one); ``dtype`` None keeps the base model's.

    Raises:
        FileNotFoundError: nothing that looks like a checkpoint at ``checkpoint``.
    """
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
