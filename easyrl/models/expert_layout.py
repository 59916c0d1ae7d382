"""Fused MoE expert tensors between transformers' in-memory layout and the released checkpoints' (which vLLM loads).

transformers holds routed experts fused in ``F.linear``'s layout, ``gate_up_proj`` ``(experts, 2 * moe_intermediate,
hidden)`` and ``down_proj`` ``(experts, hidden, moe_intermediate)``; some released checkpoints (Qwen3-VL-MoE) store
them transposed, and vLLM loads only that layout. The weight sync (``to_checkpoint_layout``) and the export
(``save_pretrained_released``) write the released layout and names, per the family's registry entry; a family outside
the registry takes its per-expert names and renames from transformers' own record of its released checkpoints
(``released_layout``); other families pass unchanged. Why (transformers' save, vLLM's loader): docs/models.md,
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
    """The registry entry of ``model_type``; an unlisted one: a default entry with :func:`released_layout`'s names."""
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    renames, per_expert = released_layout(model_type)
    return Family(model_type, checkpoint_renames=renames, per_expert_names=per_expert)


_PER_EXPERT = re.compile(r"^\.?(?:mlp\.)?experts\.\*\.(\w+)\.weight$")
_PLAIN = re.compile(r"^[\w.]+$")


@functools.cache
def released_layout(model_type: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """``(checkpoint_renames, per_expert_names)`` of ``model_type``'s released checkpoints as transformers' checkpoint
    conversion records them (``conversion_mapping.get_checkpoint_conversion_mapping``), where it fuses released
    per-expert tensors ``experts.<e>.<gate|up>.weight`` into ``experts.gate_up_proj`` and ``experts.<e>.<down>.weight``
    into ``experts.down_proj``: ``(gate, up, down)`` (DeepSeek-V3: ``gate_proj``, ``up_proj``, ``down_proj``) and each
    renaming of the conversion as ``(in-memory, released)`` (EXAONE-MoE's router bias loaded under ``mlp.gate``).
    ``((), ())`` for a family whose experts are released fused (gpt-oss), or whose renamings are regular expressions
    rather than names (not read here)."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    names: dict[str, list[str]] = {}
    renames: list[tuple[str, str]] = []
    for conversion in get_checkpoint_conversion_mapping(model_type) or []:
        sources, targets = getattr(conversion, "source_patterns", []), getattr(conversion, "target_patterns", [])
        if type(conversion).__name__ == "WeightRenaming":
            if len(sources) != 1 or len(targets) != 1 or not all(map(_PLAIN.match, (*sources, *targets))):
                return (), ()
            renames.append((targets[0], sources[0]))
            continue
        parts = [_PER_EXPERT.match(source) for source in sources]
        if len(targets) == 1 and parts and all(parts):
            names[targets[0].lstrip(".").removeprefix("mlp.")] = [part.group(1) for part in parts]
    gate_up, down = names.get("experts.gate_up_proj", []), names.get("experts.down_proj", [])
    if len(gate_up) != 2 or len(down) != 1:
        return (), ()
    return tuple(renames), (*gate_up, *down)


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
