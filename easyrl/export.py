"""Hugging Face folders from the actor: at the end of a run (every rank calls :func:`gather_full_state_dict`, rank 0
writes) and from any checkpoint, on one process without Ray::

    python -m easyrl.export CHECKPOINT OUT [--dtype auto|float32|bfloat16|float16]

``CHECKPOINT`` is a ``global_step_N`` folder (or a run's checkpoint folder: its tracker's last checkpoint). ``OUT``
receives sharded ``*.safetensors`` (a LoRA actor merged into plain weights) in the base model's dtype (its config's ``dtype`` / ``torch_dtype``; the training
master copy is float32), ``config.json``, the tokenizer/processor files and the base model's
``generation_config.json`` byte for byte. The folder is written under a temporary name and renamed when complete, so
an interrupted export never leaves a folder that looks whole.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterable
from typing import Optional

import torch

logger = logging.getLogger("easyrl.export")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The small files of a model folder besides weights; config.json and generation_config.json are handled apart.
TOKENIZER_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
                   "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
HF_FILES = ("config.json", "generation_config.json", *TOKENIZER_FILES)
MAX_SHARD_SIZE = "5GB"


def gather_full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights of an FSDP2 model on rank 0's host, ``{}`` on every other rank.

    Every rank must call it (tensors are gathered collectively, one at a time). With ``cpu_offload=True``
    ``torch.distributed.checkpoint``'s ``get_model_state_dict`` keeps the gathered copy only on rank 0, so the other
    ranks never hold a full model in host memory.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def config_dtype(config: dict) -> torch.dtype:
    """The dtype a model folder's ``config.json`` declares (``dtype``, or the older ``torch_dtype``; float32 if
    neither, or for ``auto``).

    Raises:
        ValueError: a dtype name this export does not write.
    """
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    name = str(name).replace("torch.", "")
    if name == "auto":
        return torch.float32
    if name not in DTYPES:
        raise ValueError(f"config.json declares dtype {name!r}; export supports {', '.join(DTYPES)}")
    return DTYPES[name]


def local_file(source: str, name: str) -> Optional[str]:
    """Path of file ``name`` of a model folder or hub id (through transformers' cache), or None if it has none."""
    if os.path.isdir(source):
        candidate = os.path.join(source, name)
        return candidate if os.path.isfile(candidate) else None
    from transformers.utils import cached_file

    return cached_file(source, name, _raise_exceptions_for_missing_entries=False)


def copy_hf_files(sources: Iterable[str], out: str, names: Iterable[str] = HF_FILES) -> None:
    """Copy files ``names`` byte for byte into ``out`` from the first of ``sources`` (folders or hub ids) that has
    each; files already in ``out`` are kept."""
    os.makedirs(out, exist_ok=True)
    for name in names:
        if os.path.exists(os.path.join(out, name)):
            continue
        for source in sources:
            path = local_file(source, name)
            if path is not None:
                shutil.copyfile(path, os.path.join(out, name))
                break


def _replace_dir(tmp: str, out: str) -> None:
    """Move the finished folder ``tmp`` to ``out`` (replacing an older ``out``) with renames only."""
    old = f"{out}.old"
    if os.path.exists(out):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def write_hf_folder(state: dict[str, torch.Tensor], sources: list[str], out: str,
                    dtype: Optional[torch.dtype] = None, trust_remote_code: bool = False) -> str:
    """Write a Hugging Face model folder from full weights, atomically.

    Args:
        state: full tensors by Hugging Face name (e.g. :func:`gather_full_state_dict` on rank 0).
        sources: folders or hub ids holding the base model's config, generation config and tokenizer/processor
            files (the first that has a file wins), e.g. ``[model_path, tokenizer_path]``.
        out: the folder to write (replaced if it exists, only once the new one is complete).
        dtype: weight dtype; None: the base config's (:func:`config_dtype`).
        trust_remote_code: for the model class of the config.

    Returns:
        ``out``.

    Raises:
        KeyError / RuntimeError: ``state`` does not match the config's model (missing or unexpected names).
    """
    from transformers import AutoConfig

    from easyrl.models.expert_layout import save_pretrained_released
    from easyrl.workers.fsdp_model import hf_model_class

    config_path = next((p for p in (local_file(s, "config.json") for s in sources) if p), None)
    if config_path is None:
        raise FileNotFoundError(f"none of {sources} has a config.json")
    with open(config_path, encoding="utf-8") as f:
        dtype = dtype or config_dtype(json.load(f))
    hf_config = AutoConfig.from_pretrained(os.path.dirname(config_path), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = hf_model_class(hf_config).from_config(hf_config, trust_remote_code=trust_remote_code, dtype=dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True, strict=True)
    model.tie_weights()
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(out))}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained_released(model, tmp, max_shard_size=MAX_SHARD_SIZE)  # MoE experts as the released checkpoints
    generation = next((p for p in (local_file(s, "generation_config.json") for s in sources) if p), None)
    if generation is not None:  # the base's, unchanged (save_pretrained writes one derived from the model config)
        shutil.copyfile(generation, os.path.join(tmp, "generation_config.json"))
    copy_hf_files(sources, tmp, TOKENIZER_FILES)
    _replace_dir(tmp, out)
    return out


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
