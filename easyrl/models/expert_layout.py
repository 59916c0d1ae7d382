"""Fused MoE expert tensors between transformers' in-memory layout and the released checkpoints' (which vLLM loads).

transformers 5.x holds a model's routed experts as two fused tensors per layer in ``F.linear``'s layout,
``mlp.experts.gate_up_proj`` ``(experts, 2 * moe_intermediate, hidden)`` and ``mlp.experts.down_proj`` ``(experts,
hidden, moe_intermediate)``. The released Qwen3-VL-MoE checkpoints (Qwen3-VL-30B-A3B, -235B-A22B) store them
transposed, ``(experts, hidden, 2 * moe_intermediate)`` and ``(experts, moe_intermediate, hidden)``:

* transformers 5.19 transposes on load (``conversion_mapping``: ``Transpose(1, 2, check_dims=True)`` for
  ``qwen3_vl_moe``) but does NOT transpose back on ``save_pretrained``: its reverse op compares with the in-memory
  shape and, finding it equal, keeps the in-memory layout;
* vLLM 0.32 loads only the released layout (``Qwen3VLMoeDecoderLayer``: ``is_fused_checkpoint_transposed=True``);
  given transformers' layout it fails in ``fused_moe`` ``_load_w2`` ("The size of tensor a (128) must match the size
  of tensor b (256)"), or, when ``2 * moe_intermediate == hidden`` makes ``gate_up_proj`` square, silently loads it
  transposed.

So the weight sync hands vLLM the actor's experts in the released layout (``to_checkpoint_layout``), and the tiny
builder and the Hugging Face export save that layout too (``save_pretrained_released``). Model types with fused
experts stored in transformers' own layout (``qwen3_5_moe``, and the ``qwen2_moe`` family whose checkpoints hold one
tensor per expert) pass unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from easyrl.models.families import FAMILIES


def needs_transpose(name: str, model_type: str) -> bool:
    """Whether the Hugging Face tensor ``name`` of a ``model_type`` model is a fused expert tensor that the released
    checkpoints store transposed (its family's ``transposed_experts``, ``easyrl.models.families``)."""
    return name.endswith(getattr(FAMILIES.get(model_type), "transposed_experts", ()))


def to_checkpoint_layout(named_tensors: Iterable[tuple[str, torch.Tensor]],
                         model_type: str) -> Iterator[tuple[str, torch.Tensor]]:
    """transformers' in-memory layout -> the released checkpoints' (the one vLLM loads), lazily, tensor by tensor.

    Args:
        named_tensors: ``(HF name, tensor)`` pairs; fused expert tensors are 3-D ``(experts, out, in)``.
        model_type: ``config.model_type`` of the model (the top level one, e.g. ``qwen3_vl_moe``).

    Yields:
        The same pairs, with each fused expert tensor of a family with ``transposed_experts`` as ``(experts, in,
        out)`` (contiguous), those of a family with ``per_expert_names`` split into one ``(out, in)`` view per expert
        (``...experts.<e>.<gate|up|down>.weight``), and each name renamed as the family's ``checkpoint_renames`` say
        (``easyrl.models.families``: Mixtral's ``mlp`` -> ``block_sparse_moe``); every other tensor unchanged (the
        same object).

    Raises:
        ValueError: a tensor that should be transposed is not 3-D (a renamed or unfused layout: the mapping above no
            longer matches the installed transformers).
    """
    renames = getattr(FAMILIES.get(model_type), "checkpoint_renames", ())
    for name, tensor in named_tensors:
        if needs_transpose(name, model_type):
            if tensor.dim() != 3:
                raise ValueError(f"{name}: expected a fused (experts, out, in) tensor, got shape {tuple(tensor.shape)}")
            tensor = tensor.transpose(1, 2).contiguous()
        for in_memory, released in renames:
            name = name.replace(in_memory, released)
        yield from _per_expert(name, tensor, getattr(FAMILIES.get(model_type), "per_expert_names", ()))


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
    """``model.save_pretrained(out, **kwargs)`` with fused experts in the released checkpoints' layout and names (the
    ones that vLLM and transformers' own loading expect), for families with ``transposed_experts`` or
    ``checkpoint_renames`` (``to_checkpoint_layout``); a plain ``save_pretrained`` for every other model.

    Args:
        model: a transformers ``PreTrainedModel`` (weights materialised; tied weights tied).
        out: the folder to write.
        kwargs: passed on to ``save_pretrained`` (e.g. ``max_shard_size``).
    """
    model_type = model.config.model_type
    state = model.state_dict()
    renamed = getattr(FAMILIES.get(model_type), "checkpoint_renames", ())
    if not renamed and not any(needs_transpose(name, model_type) for name in state):
        model.save_pretrained(out, **kwargs)
        return
    # transformers' reverse conversion would keep its in-memory layout (see the module docstring), so it is skipped
    model.save_pretrained(out, state_dict=dict(to_checkpoint_layout(state.items(), model_type)),
                          save_original_format=False, **kwargs)
