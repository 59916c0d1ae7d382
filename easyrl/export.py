"""A Hugging Face folder from any checkpoint, on one process without Ray::

    python -m easyrl.export CHECKPOINT OUT [--dtype auto|float32|bfloat16|float16]

``CHECKPOINT`` is a ``global_step_N`` folder (or a run's checkpoint folder: its tracker's last checkpoint). The
command reads the actor's ``torch.distributed.checkpoint`` shards into full weights (a LoRA actor merged into plain
weights) and writes ``OUT`` with ``easyrl.models.hf_folder.write_hf_folder``: sharded ``*.safetensors`` in the base
model's dtype (its config's ``dtype`` / ``torch_dtype``; the training master copy is float32), ``config.json``, the
tokenizer/processor files and the base model's ``generation_config.json`` byte for byte, written under a temporary
name and renamed when complete, so an interrupted export never leaves a folder that looks whole. (The end-of-run
export of a training run is ``FSDPWorker.save_hf``, on the same library.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Optional

import torch

from easyrl.models.hf_folder import DTYPES, write_hf_folder

logger = logging.getLogger("easyrl.export")


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
    from easyrl.trainer.checkpoint import find_last_checkpoint

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
    """``python -m easyrl.export``: a Hugging Face folder ``out`` from a checkpoint (see the module docstring)."""
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


def main(argv: Optional[list[str]] = None) -> int:
    """Command-line entry point; exit status 0, or 2 for a bad argument or checkpoint (message, no traceback)."""
    parser = argparse.ArgumentParser(prog="python -m easyrl.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a global_step_N folder, or a run's checkpoint folder (its last one)")
    parser.add_argument("out", help="the Hugging Face folder to write (must not exist)")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help="weights dtype (auto: the base's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
    if os.path.exists(args.out):
        print(f"easyrl.export: {args.out} exists; give a new folder (an export never overwrites one)", file=sys.stderr)
        return 2
    try:
        out = export_checkpoint(args.checkpoint, args.out, None if args.dtype == "auto" else DTYPES[args.dtype])
    except FileNotFoundError as err:
        print(f"easyrl.export: {err}", file=sys.stderr)
        return 2
    logger.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
