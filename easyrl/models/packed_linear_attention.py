"""Linear-attention layers over a packed row one sequence at a time: real sequence boundaries for Gated DeltaNet.

In Qwen3.5 / Qwen3-Next the Gated-DeltaNet layers (``linear_attn``: causal convolution, recurrent state) do not see
a packed row's boundaries (transformers' torch fallbacks ignore them), so the state would run from one sequence into
the next (docs/models.md, "Layout notes"). :func:`split_linear_attention_at_sequences` hooks each such decoder layer
to run ``linear_attn`` once per sequence (boundaries from the text position ids, as
``easyrl.models.packed_attention.sequence_lengths``), each from a zero state: the padded batch's numbers, also under
gradient checkpointing. Where flash-linear-attention and causal-conv1d are installed (:func:`varlen_kernels`), the
row goes through in one call with ``cu_seq_lens_q`` / ``seq_idx`` instead (checked with stand-ins on the CPU only).
Padded batches, single sequences and cached generation pass through unchanged.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
from typing import Optional

import torch

from easyrl.models.packed_attention import sequence_lengths

__all__ = ["split_linear_attention_at_sequences", "varlen_kernels"]


@functools.cache
def varlen_kernels() -> bool:
    """Whether ``fla`` (flash-linear-attention) and ``causal_conv1d`` are installed: transformers (5.19) then runs
    Gated DeltaNet with their kernels instead of its PyTorch fallbacks, which ignore the sequence boundaries."""
    return all(importlib.util.find_spec(name) is not None for name in ("fla", "causal_conv1d"))


def split_linear_attention_at_sequences(model: torch.nn.Module) -> int:
    """Make every linear-attention mixer of ``model`` run a packed row one sequence at a time; call once before
    sharding. Decoder layers with a ``linear_attn`` (Qwen3.5, Qwen3-Next) are changed, other models left alone.
    Returns the number of layers changed."""
    count = 0
    for layer in model.modules():
        mixer = getattr(layer, "linear_attn", None)
        if not isinstance(mixer, torch.nn.Module) or getattr(mixer, "_easyrl_split", False):
            continue
        state: dict[str, Optional[list[int]]] = {"lengths": None}
        layer.register_forward_pre_hook(_boundaries_hook(state), with_kwargs=True)
        mixer.forward = _split_forward(mixer.forward, state)
        mixer._easyrl_split = True
        count += 1
    return count


def _boundaries_hook(state: dict):
    """The decoder layer's pre-hook: remember the lengths of the sequences packed in this call's row (None when the
    call is not a packed row of several sequences)."""

    def hook(module, args, kwargs):
        position_ids = kwargs.get("position_ids")
        hidden = args[0] if args else kwargs.get("hidden_states")
        lengths = None
        if (position_ids is not None and hidden is not None and hidden.shape[0] == 1
                and position_ids.shape[-1] == hidden.shape[1] and kwargs.get("attention_mask") is None):
            lengths = sequence_lengths(position_ids[..., -hidden.shape[1]:].reshape(-1))
        state["lengths"] = lengths if lengths is not None and len(lengths) > 1 else None
        return None

    return hook


def _split_forward(forward, state: dict):
    """``linear_attn.forward`` that runs ``(1, total, hidden)`` one sequence at a time (or in one call with the
    boundaries, :func:`varlen_kernels`) when the layer's pre-hook saw a packed row; anything else (a padding mask, a
    cache, one sequence) goes to ``forward`` unchanged."""

    def split(hidden_states: torch.Tensor, cache_params=None, attention_mask=None, **kwargs) -> torch.Tensor:
        lengths = state["lengths"]
        if (lengths is None or cache_params is not None or attention_mask is not None
                or hidden_states.shape[0] != 1 or sum(lengths) != hidden_states.shape[1]):
            return forward(hidden_states=hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                           **kwargs)
        if varlen_kernels():  # one call, the boundaries handed to the kernels
            device = hidden_states.device
            bounds = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.long, device=device)  # fla: int64
            seq_idx = torch.arange(len(lengths), dtype=torch.int32, device=device).repeat_interleave(
                torch.tensor(lengths, device=device))[None]
            return forward(hidden_states=hidden_states, cache_params=None, attention_mask=None,
                           **{**kwargs, "cu_seq_lens_q": bounds, "seq_idx": seq_idx})
        pieces = [forward(hidden_states=piece, cache_params=None, attention_mask=None, **kwargs)
                  for piece in hidden_states.split(lengths, dim=1)]
        return torch.cat(pieces, dim=1)

    return split
