"""A Hugging Face folder from a training checkpoint, on one process without Ray (``easyrl export`` /
``python -m easyrl.export``, and ``easyrl eval`` given a checkpoint).

The actor's ``torch.distributed.checkpoint`` shards are read into full weights (a LoRA actor merged into plain
weights) and written with ``easyrl.models.hf_folder.write_hf_folder``: sharded ``*.safetensors`` in the base model's
dtype (its config's ``dtype`` / ``torch_dtype``; the training master copy is float32), ``config.json``, the
tokenizer/processor files and the base model's ``generation_config.json`` byte for byte, written under a temporary
name and renamed when complete, so an interrupted export never leaves a folder that looks whole. (The end-of-run
export of a training run is ``FSDPWorker.save_hf``, on the same library.)
"""

from __future__ import annotations

import json
import os
from typing import Optional

import torch

from easyrl.models.hf_folder import write_hf_folder
from easyrl.trainer.checkpoint import find_last_checkpoint


def load_checkpoint_weights(actor_dir: str) -> dict[str, torch.Tensor]:
    """The actor's full float32 weights from the ``torch.distributed.checkpoint`` shards in ``actor_dir``, read on
    this one process (no process group); the optimizer state is not read."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(actor_dir).read_metadata()
    state = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and hasattr(meta, "size"):
            state[key[len("model."):]] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    dcp.load({"model": state}, checkpoint_id=actor_dir, no_dist=True)
    return state


def resolve_checkpoint(path: str) -> str:
    """A ``global_step_N`` folder from ``path``: itself, its parent if ``path`` is its ``actor`` folder, or the last
    checkpoint of a run's checkpoint folder.

    Raises:
        FileNotFoundError: nothing that looks like a checkpoint at ``path``.
    """
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
    """A LoRA actor's weights merged into the plain model's (``W + lora_alpha / r * B @ A``, see
    ``easyrl.models.lora.merge_lora_stream``), with the scale from the checkpoint's ``adapter_config.json``;
    ``state`` unchanged when it holds no adapter.

    Raises:
        FileNotFoundError: the weights hold an adapter but ``hf_dir`` has no ``adapter_config.json``.
    """
    from easyrl.models.lora import is_adapter_key, merge_lora_stream

    if not any(is_adapter_key(name) for name in state):
        return state
    path = os.path.join(hf_dir, "adapter_config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the checkpoint holds a LoRA adapter but {path} is missing (its scale is needed)")
    with open(path, encoding="utf-8") as f:
        adapter = json.load(f)
    return dict(merge_lora_stream(state.items(), adapter["lora_alpha"] / adapter["r"]))
