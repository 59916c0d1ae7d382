"""Hugging Face model folders from full weights: the model class for a config, the folder's small files, and the
atomic write of a whole folder (:func:`write_hf_folder`: sharded safetensors in the base model's dtype, config,
tokenizer/processor and generation config copied byte for byte; written under a temporary name, then renamed).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from typing import Optional

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The small files of a model folder besides weights; config.json and generation_config.json are handled apart.
TOKENIZER_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
                   "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
HF_FILES = ("config.json", "generation_config.json", *TOKENIZER_FILES)
MAX_SHARD_SIZE = "5GB"


def hf_model_class(hf_config) -> type:
    """``AutoModelForImageTextToText`` when the config has a ``vision_config`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL),
    else ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText  # heavy: imported when used

    return AutoModelForImageTextToText if getattr(hf_config, "vision_config", None) is not None else AutoModelForCausalLM


def supports_sdpa(hf_config) -> bool:
    """Whether the transformers class built for the config (:func:`hf_model_class`'s) runs with SDPA
    (``_supports_sdpa``); False for the classes that run only with their own eager attention (attention sinks:
    gpt-oss, MiMo-V2-Flash, DeepSeek-V4, Granite SWA). True for a class the auto mapping does not hold (remote
    code): what it states is read where it is built."""
    from transformers.models.auto.auto_factory import _get_model_class

    auto = hf_model_class(hf_config)
    try:
        cls = _get_model_class(hf_config, auto._model_mapping)
    except (KeyError, ValueError):
        return True
    return bool(getattr(cls, "_supports_sdpa", True))


def config_dtype(config: dict) -> torch.dtype:
    """The dtype a folder's ``config.json`` declares (``dtype`` or ``torch_dtype``; float32 if neither or ``auto``);
    ValueError for a dtype name this export does not write."""
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    name = str(name).replace("torch.", "")
    if name == "auto":
        return torch.float32
    if name not in DTYPES:
        raise ValueError(f"config.json declares dtype {name!r}; export supports {', '.join(DTYPES)}")
    return DTYPES[name]


def first_file(sources: Iterable[str], name: str) -> Optional[str]:
    """Path of file ``name`` in the first of ``sources`` (model folders or hub ids, through transformers' cache) that
    has it, or None."""
    from transformers.utils import cached_file

    for source in sources:
        path = (os.path.join(source, name) if os.path.isdir(source)
                else cached_file(source, name, _raise_exceptions_for_missing_entries=False))
        if path is not None and os.path.isfile(path):
            return path
    return None


def copy_hf_files(sources: Iterable[str], out: str, names: Iterable[str] = HF_FILES) -> None:
    """Copy files ``names`` byte for byte into ``out`` from the first of ``sources`` that has each (:func:`first_file`);
    files already in ``out`` are kept."""
    os.makedirs(out, exist_ok=True)
    for name in names:
        if not os.path.exists(os.path.join(out, name)) and (path := first_file(sources, name)) is not None:
            shutil.copyfile(path, os.path.join(out, name))


def open_to_umask(folder: str) -> None:
    """Give the files of ``folder`` (not recursive) the mode a plain ``open`` gives, 0o666 less the umask (0o644
    typically): safetensors writes its files 0o600, readable by their owner only."""
    umask = os.umask(0)
    os.umask(umask)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            os.chmod(path, 0o666 & ~umask)


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
    """Write ``out``, a Hugging Face model folder of ``state`` (full tensors by Hugging Face name) in ``dtype`` (None:
    :func:`config_dtype`), atomically (replaced once the new one is whole); the config, generation config and
    tokenizer files come from the first of ``sources`` that has each (:func:`first_file`). Returns ``out``.
    FileNotFoundError: no ``config.json`` in ``sources``; KeyError / RuntimeError: ``state`` does not match the
    config's model."""
    from transformers import AutoConfig

    from easyrl.models.expert_layout import save_pretrained_released

    config_path = first_file(sources, "config.json")
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
    generation = first_file(sources, "generation_config.json")
    if generation is not None:  # the base's, unchanged (save_pretrained writes one derived from the model config)
        shutil.copyfile(generation, os.path.join(tmp, "generation_config.json"))
    copy_hf_files(sources, tmp, TOKENIZER_FILES)
    open_to_umask(tmp)
    _replace_dir(tmp, out)
    return out
