"""LoRA on the actor with peft (``worker.actor.model.lora``; Hu et al. 2021, "LoRA", Eq. 3:
``h = W x + (alpha / rank) B A x``, ``B`` starting at 0). The reference policy is the same model with the adapter off;
vLLM and the export get the merged ``W + scale * B @ A`` (why merged: docs/lora.md).
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

import torch

ADAPTER_NAME = "default"  # peft's name of the one adapter
_LORA_KEY = re.compile(rf"^(?P<module>.+)\.(?P<part>lora_A|lora_B)\.{ADAPTER_NAME}\.weight$")
_BASE_KEY = re.compile(r"^(?P<module>.+)\.base_layer\.(?P<leaf>weight|bias)$")


def target_modules(spec: str) -> Any:
    """peft's ``target_modules`` from the config string: ``"all-linear"`` as is (every linear layer but the output
    head), else a comma-separated list of module-name suffixes (``"q_proj,v_proj"`` -> ``["q_proj", "v_proj"]``)."""
    spec = spec.strip()
    return spec if spec == "all-linear" else [part.strip() for part in spec.split(",") if part.strip()]


def excluded_modules(lora: Any, model: torch.nn.Module) -> Optional[str]:
    """``lora.exclude_modules`` as peft gets it for ``model``: the default (``.*visual.*``, the vision tower) becomes
    the family's own tower and projector (``easyrl.models.families.tower_exclude``: ``.*(vision_tower|
    multi_modal_projector).*`` for InternVL; the default itself for Qwen-VL and text models); a pattern of the user's
    own, or null (None: nothing excluded), as written."""
    from easyrl.models.families import tower_exclude

    default = next(f.default for f in dataclasses.fields(lora) if f.name == "exclude_modules")  # LoraConfig's
    if lora.exclude_modules != default:
        return lora.exclude_modules or None
    return tower_exclude(model) or lora.exclude_modules


def peft_config(lora: Any, model_path: Optional[str] = None, exclude: Optional[str] = None) -> Any:
    """A ``peft.LoraConfig`` from ``worker.actor.model.lora`` (``rank``, ``alpha``, ``target_modules``) and
    ``exclude`` (:func:`excluded_modules`: a regular expression matched against full module names) on the base
    ``model_path``; dropout 0 (the log-probs of the update must equal the ones computed for the same weights), no bias
    training."""
    from peft import LoraConfig

    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=target_modules(lora.target_modules),
                      exclude_modules=exclude, lora_dropout=0.0, bias="none", base_model_name_or_path=model_path)


def apply_lora(model: torch.nn.Module, lora: Any, model_path: Optional[str] = None) -> Any:
    """Insert LoRA layers (``worker.actor.model.lora``, ``rank > 0``) into the Hugging Face ``model`` in place (also on
    the meta device; module names kept) and freeze everything but them; ``model_path`` is recorded as the adapter's
    base. Returns the ``peft.PeftModel`` wrapper (``wrapper.base_model.model`` is ``model``). ModelError: no module
    matches ``target_modules`` (naming the key and the value)."""
    from peft import get_peft_model

    from easyrl.errors import ModelError

    config = peft_config(lora, model_path, excluded_modules(lora, model))
    with warnings.catch_warnings():  # the default exclude pattern (the vision tower) matches nothing on text models
        warnings.filterwarnings("ignore", message=".*no modules were excluded.*")
        try:
            return get_peft_model(model, config)
        except ValueError as err:
            raise ModelError(
                f"worker.actor.model.lora.target_modules={lora.target_modules!r} selects no layer of "
                f"{type(model).__name__} ({err}). Give 'all-linear' or names such as q_proj,k_proj,v_proj,o_proj."
            ) from None


@contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` (with LoRA layers from ``apply_lora``) as the base model, the reference policy of a LoRA run:
    every peft tuner layer's adapter is switched off and back on at exit."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def lora_scale(lora: Any) -> float:
    """peft's scaling of the adapter's output, ``alpha / rank`` (Hu et al. 2021, Sec. 4.1)."""
    return lora.alpha / lora.rank


def is_adapter_key(name: str) -> bool:
    """Whether ``name`` is a LoRA matrix (``...lora_A.default.weight`` / ``...lora_B.default.weight``)."""
    return _LORA_KEY.match(name) is not None


def merge_sources(names: Iterable[str]) -> dict[str, list[str]]:
    """Which of a LoRA model's state-dict ``names`` :func:`merge_lora_stream` turns into each plain name, in order of
    first appearance: ``X.weight`` from ``X.base_layer.weight``, ``X.lora_A.default.weight`` and
    ``X.lora_B.default.weight``; ``X.bias`` from ``X.base_layer.bias``; any other name from itself. Names only (the
    merge itself is ``merge_lora_stream``'s); raises nothing (an incomplete module is ``merge_lora_stream``'s
    ValueError)."""
    sources: dict[str, list[str]] = {}
    for name in names:
        lora, base = _LORA_KEY.match(name), _BASE_KEY.match(name)
        plain = (f"{base['module']}.{base['leaf']}" if base is not None
                 else f"{lora['module']}.weight" if lora is not None else name)
        sources.setdefault(plain, []).append(name)
    return sources


def merge_lora_stream(named: Iterable[tuple[str, torch.Tensor]], scale: float,
                      dtype: Optional[torch.dtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain model's ``(name, tensor)`` pairs from a LoRA model's, lazily: ``X.base_layer.weight`` ``(out, in)``,
    ``X.lora_A.default.weight`` ``(rank, in)`` and ``X.lora_B.default.weight`` ``(out, rank)`` become
    ``X.weight = W + scale * B @ A`` (float32, returned in ``dtype`` or W's); ``X.base_layer.bias`` becomes ``X.bias``;
    other names pass unchanged, in order. A module's three tensors may arrive in any order and bucket. ValueError: a
    LoRA matrix without its base weight, or a base weight left without its matrices at the end."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        lora = _LORA_KEY.match(name)
        base = _BASE_KEY.match(name)
        if base is not None and base["leaf"] == "bias":
            yield f"{base['module']}.bias", tensor
            continue
        if lora is None and base is None:
            yield name, tensor
            continue
        module = (lora or base)["module"]
        parts = pending.setdefault(module, {})
        parts[lora["part"] if lora else "W"] = tensor
        if len(parts) == 3:
            del pending[module]
            weight, lora_a, lora_b = parts["W"], parts["lora_A"], parts["lora_B"]  # W + scale * B @ A in float32
            merged = weight.float() + scale * (lora_b.float() @ lora_a.float())
            yield f"{module}.weight", merged.to(dtype or weight.dtype)
    if pending:
        incomplete = {module: sorted(parts) for module, parts in pending.items()}
        raise ValueError(f"LoRA modules without a base weight or a matrix: {incomplete}")


def save_adapter(state: dict[str, torch.Tensor], lora: Any, model_path: str, out: str,
                 exclude: Optional[str] = None) -> str:
    """Write the adapter matrices of ``state`` (the actor's full state dict, peft names) in peft's format into folder
    ``out``: ``adapter_config.json`` (``lora``: ``worker.actor.model.lora``, with the ``exclude`` pattern the model
    was wrapped with, :func:`excluded_modules`, on the base ``model_path``) and ``adapter_model.safetensors``,
    loadable with ``peft.PeftModel.from_pretrained(base_model, out)``."""
    from safetensors.torch import save_file

    from easyrl.models.hf_folder import open_to_umask

    os.makedirs(out, exist_ok=True)
    peft_config(lora, model_path, exclude).save_pretrained(out)
    tensors = {f"base_model.model.{name.replace(f'.{ADAPTER_NAME}.', '.')}": t.contiguous()
               for name, t in state.items() if is_adapter_key(name)}
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    open_to_umask(out)
    return out
