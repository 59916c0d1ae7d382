"""Fused MoE expert tensors between transformers' in-memory layout and the released checkpoints' (which vLLM loads).

transformers holds routed experts fused in ``F.linear``'s layout, ``gate_up_proj`` ``(experts, 2 * moe_intermediate,
hidden)`` and ``down_proj`` ``(experts, hidden, moe_intermediate)``; some released checkpoints (Qwen3-VL-MoE) store
them transposed, and vLLM loads only that layout. The weight sync (``to_checkpoint_layout``) and the export
(``save_pretrained_released``) write the released layout and names, per the family's registry entry; a family outside
the registry takes its per-expert names from transformers' own record of its released checkpoints
(``released_expert_names``); other families pass unchanged. Why (transformers' save, vLLM's loader): docs/models.md,
"Layout notes".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from easyrl.models.families import FAMILIES, Family


def _entry(model_type: str) -> Family:
    """The registry entry of ``model_type``; an unlisted one: a default entry with :func:`released_expert_names`."""
    return FAMILIES.get(model_type) or Family(model_type, per_expert_names=released_expert_names(model_type))


_PER_EXPERT = re.compile(r"^mlp\.experts\.\*\.(\w+)\.weight$")


@functools.cache
def released_expert_names(model_type: str) -> tuple[str, ...]:
    """``(gate, up, down)`` where transformers' checkpoint conversion of ``model_type``
    (``conversion_mapping.get_checkpoint_conversion_mapping``) fuses released per-expert tensors
    ``mlp.experts.<e>.<gate|up>.weight`` into ``mlp.experts.gate_up_proj`` and ``mlp.experts.<e>.<down>.weight`` into
    ``mlp.experts.down_proj`` and renames nothing (DeepSeek-V3: ``gate_proj``, ``up_proj``, ``down_proj``); else ``()``
    (fused as transformers holds them, or a layout with renames this reading does not follow)."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    conversions = get_checkpoint_conversion_mapping(model_type) or []
    names: dict[str, list[str]] = {}
    for conversion in conversions:
        sources, targets = getattr(conversion, "source_patterns", []), getattr(conversion, "target_patterns", [])
        if type(conversion).__name__ != "WeightConverter":
            return ()  # a renaming
        parts = [_PER_EXPERT.match(source) for source in sources]
        if len(targets) == 1 and all(parts):
            names[targets[0]] = [part.group(1) for part in parts]
    gate_up, down = names.get("mlp.experts.gate_up_proj", []), names.get("mlp.experts.down_proj", [])
    return (*gate_up, *down) if len(gate_up) == 2 and len(down) == 1 else ()


def needs_transpose(name: str, model_type: str) -> bool:
    """Whether the Hugging Face tensor ``name`` is a fused expert tensor that ``model_type``'s released checkpoints
    store transposed (its family's ``transposed_experts``)."""
    return name.endswith(_entry(model_type).transposed_experts)


def to_checkpoint_layout(named_tensors: Iterable[tuple[str, torch.Tensor]],
                         model_type: str) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, tensor)`` pairs (fused experts 3-D ``(experts, out, in)``) of a top-level ``config.model_type``
    in the released checkpoints' layout (the one vLLM loads), lazily: fused experts of a ``transposed_experts`` family
    as contiguous ``(experts, in, out)``, those of a ``per_expert_names`` family as one ``(out, in)`` view per expert,
    names changed per ``checkpoint_renames``; every other tensor unchanged (the same object). ValueError: a tensor to
    transpose is not 3-D (the installed transformers' layout changed)."""
    entry = _entry(model_type)
    for name, tensor in named_tensors:
        if needs_transpose(name, model_type):
            if tensor.dim() != 3:
                raise ValueError(f"{name}: expected a fused (experts, out, in) tensor, got shape {tuple(tensor.shape)}")
            tensor = tensor.transpose(1, 2).contiguous()
        for in_memory, released in entry.checkpoint_renames:
            name = name.replace(in_memory, released)
        yield from _per_expert(name, tensor, entry.per_expert_names)


def _per_expert(name: str, tensor: torch.Tensor, names: tuple[str, ...]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)``, or for a fused ``experts.gate_up_proj`` / ``experts.down_proj`` with ``names`` = (gate, up,
    down) one tensor per expert: gate_up's first half of rows is the gate (transformers concatenates gate, up)."""
    fused = next((part for part in ("gate_up_proj", "down_proj") if name.endswith("experts." + part)), None)
    if not names or fused is None:
        yield name, tensor
        return
    prefix, half = name[: -len(fused)], tensor.shape[1] // 2
    for e, expert in enumerate(tensor):
        if fused == "down_proj":
            yield f"{prefix}{e}.{names[2]}.weight", expert
        else:
            yield f"{prefix}{e}.{names[0]}.weight", expert[:half]
            yield f"{prefix}{e}.{names[1]}.weight", expert[half:]


def save_pretrained_released(model: Any, out: str, **kwargs: Any) -> None:
    """``model.save_pretrained(out, **kwargs)`` (a transformers model, weights materialised and tied) with fused experts
    in the released checkpoints' layout and names (:func:`to_checkpoint_layout`) where the family needs it."""
    model_type = model.config.model_type
    state = model.state_dict()
    if not _entry(model_type).checkpoint_renames and not any(needs_transpose(name, model_type) for name in state):
        model.save_pretrained(out, **kwargs)
        return
    # transformers' reverse conversion would keep its in-memory layout (see the module docstring), so it is skipped
    model.save_pretrained(out, state_dict=dict(to_checkpoint_layout(state.items(), model_type)),
                          save_original_format=False, **kwargs)
