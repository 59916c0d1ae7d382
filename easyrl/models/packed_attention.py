"""Attention over a packed row one sequence at a time, where no varlen kernel exists (the CPU).

transformers' ``sdpa`` runs a packed row ``(1, total)`` as ONE masked ``total x total`` attention (``total ** 2`` work
for ``sum(len_i ** 2)`` needed, no flash kernel, ``(heads, total, total)`` weights kept). :data:`PACKED_SDPA`
(registered with ``AttentionInterface`` / ``AttentionMaskInterface``) runs one causal, unmasked SDPA call per sequence,
splitting where the text positions do not continue by +1 (transformers' rule), with each layer's sliding window or
attention chunk applied within its sequence. Masked, bidirectional or cached calls go to ``sdpa`` unchanged.
:data:`PACKED_EAGER` does the same with the model's own eager attention, for the models transformers runs without SDPA
(attention sinks: gpt-oss, MiMo-V2-Flash, DeepSeek-V4, Granite SWA).
"""

from __future__ import annotations

import sys
from contextvars import ContextVar
from typing import Any, Optional

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

__all__ = ["PACKED_SDPA", "PACKED_EAGER", "sequence_lengths", "packed_lengths", "packed_sdpa_attention",
           "packed_sdpa_mask", "packed_eager_attention", "packed_eager_mask", "carry_positions"]

PACKED_SDPA = "easyrl_packed_sdpa"
"""The ``attn_implementation`` name of the per-sequence attention."""
PACKED_EAGER = "easyrl_packed_eager"
"""The ``attn_implementation`` name of the per-sequence eager attention (a model class with ``_supports_sdpa``
False)."""


_LAYER_POSITIONS: ContextVar[tuple[Optional[torch.Tensor], ...]] = ContextVar("easyrl_layer_positions", default=())
"""The ``position_ids`` of the decoder layers being called (:func:`carry_positions`), innermost last; per thread and
context (the backward's recomputation may run in autograd's own thread)."""


def carry_positions(model: torch.nn.Module) -> None:
    """Hook the decoder layers of ``model`` (the ``layers`` of its text decoder, the module holding ``embed_tokens``)
    so that, during each layer's call, the packed attention reads the ``position_ids`` the layer was given where the
    layer does not pass them on to its attention (transformers 5.19's ``Llama4TextDecoderLayer``): the sequence
    boundaries of a packed row. Set and cleared around every call, so a gradient-checkpointed layer's recomputation
    in the backward sees them too. Once per model; a model without such a decoder is left as it is."""
    decoder = next((m for m in model.modules() if isinstance(getattr(m, "layers", None), torch.nn.ModuleList)
                    and hasattr(m, "embed_tokens")), None)
    if decoder is None or getattr(decoder, "_easyrl_carries_positions", False):
        return
    for layer in decoder.layers:
        layer.register_forward_pre_hook(_enter_layer, with_kwargs=True)
        layer.register_forward_hook(_leave_layer, always_call=True)
    decoder._easyrl_carries_positions = True


def _enter_layer(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    _LAYER_POSITIONS.set(_LAYER_POSITIONS.get() + (kwargs.get("position_ids"),))


def _leave_layer(module: torch.nn.Module, args: tuple, output: Any) -> None:
    _LAYER_POSITIONS.set(_LAYER_POSITIONS.get()[:-1])


def sequence_lengths(position_ids: torch.Tensor) -> list[int]:
    """The length of each sequence packed in ``position_ids`` ``(1, total)`` or ``(total,)``, in order (summing to
    ``total``): a position that is not the previous one + 1 starts a sequence (transformers' rule). mRoPE's 3-D
    positions ``(3, 1, total)`` (what GLM-4.5V hands its decoder layers instead of the text row): a sequence starts
    where all three rows are 0 (an image's rows repeat and jump, and every sequence starts at 0)."""
    if position_ids.dim() == 3:
        starts = (position_ids == 0).all(dim=0).reshape(-1)
        starts[0] = True
        edges = torch.nonzero(starts).flatten().tolist() + [starts.numel()]
        return [end - start for start, end in zip(edges[:-1], edges[1:])]
    pos = position_ids.reshape(-1)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[1:] = pos[1:] != pos[:-1] + 1
    edges = torch.nonzero(starts).flatten().tolist() + [pos.numel()]
    return [end - start for start, end in zip(edges[:-1], edges[1:])]


def packed_lengths(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   attention_mask: Optional[torch.Tensor], is_causal: Optional[bool],
                   position_ids: Optional[torch.Tensor]) -> Optional[list[int]]:
    """The sequence lengths of an attention call over one causal packed row (no mask, one row, position ids, the
    query as long as the keys: not decoding), read off ``position_ids`` (:func:`sequence_lengths`; None: those its
    decoder layer was given, :func:`carry_positions`); None for any other call. ``is_causal`` None: the module's
    ``is_causal`` (True when it has none)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if position_ids is None and _LAYER_POSITIONS.get():
        position_ids = _LAYER_POSITIONS.get()[-1]
    if (attention_mask is None and position_ids is not None and query.shape[0] == 1 and causal
            and query.shape[2] == key.shape[2] == position_ids.shape[-1]):
        return sequence_lengths(position_ids)
    return None


def _packed_mask(padded_mask, *args, **kwargs) -> Optional[torch.Tensor]:
    """No mask for a packed row without a padding mask (``attention_mask`` None: the packed attention reads the
    sequence boundaries off the position ids), else ``padded_mask``'s (a ``masking_utils`` mask function)."""
    if kwargs.get("attention_mask") is None and not args:
        return None
    return padded_mask(*args, **kwargs)


def packed_sdpa_mask(*args, **kwargs) -> Optional[torch.Tensor]:
    """transformers' mask-function signature (``masking_utils.sdpa_mask``'s arguments): :func:`_packed_mask` with
    ``sdpa_mask``."""
    return _packed_mask(sdpa_mask, *args, **kwargs)


def packed_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                          is_causal: Optional[bool] = None, position_ids: Optional[torch.Tensor] = None, **kwargs
                          ) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature, causal within each sequence of one packed row and nothing across:
    ``query`` ``(1, heads, total, head_dim)``, ``key``/``value`` ``(1, kv_heads, total, head_dim)``, ``position_ids``
    ``(1, total)`` restarting at 0 at each sequence -> ``((1, total, heads, head_dim), None)``. A sliding-window layer
    (``sliding_window`` in ``kwargs``) gets its band mask per sequence, a chunked one (:func:`attention_chunk`) its
    block-diagonal causal mask. Calls with a mask (a padded batch), without
    position ids, of several rows, of a bidirectional module or with a cache go to ``sdpa_attention_forward``."""
    lengths = packed_lengths(module, query, key, attention_mask, is_causal, position_ids)
    if lengths is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    window, chunk = kwargs.get("sliding_window"), attention_chunk(module)
    outputs = [
        sdpa_attention_forward(module, q, k, v, _window_mask(q.shape[2], window, chunk, q.device), dropout=dropout,
                               scaling=scaling, is_causal=True, **kwargs)[0]
        for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2))
    ]
    return torch.cat(outputs, dim=1), None


def attention_chunk(module: torch.nn.Module) -> Optional[int]:
    """The chunk (tokens) of a chunked-attention layer, as transformers' ``create_chunked_causal_mask`` reads it: the
    module's config names its layer ``chunked_attention`` (``layer_types[layer_idx]``: Llama 4's local layers) and
    holds ``attention_chunk_size``; None for any other layer."""
    config, index = getattr(module, "config", None), getattr(module, "layer_idx", None)
    kinds = getattr(config, "layer_types", None) or ()
    if index is None or index >= len(kinds) or kinds[index] != "chunked_attention":
        return None
    return getattr(config, "attention_chunk_size", None)


def _causal_mask(length: int, window: Optional[int], chunk: Optional[int], device: torch.device) -> torch.Tensor:
    """``(1, 1, length, length)`` bool mask over one sequence: query ``i`` sees keys ``j <= i``; with a ``window`` only
    ``i - window < j`` (transformers' ``sliding_window_overlay``, vLLM's window); with a ``chunk`` only keys of its
    own block, ``j // chunk == i // chunk`` (``chunked_overlay``, counted from the sequence's first token as
    transformers counts it past the left padding and vLLM from position 0)."""
    i = torch.arange(length, device=device)
    distance = i[:, None] - i[None, :]
    allowed = distance >= 0
    if window is not None:
        allowed &= distance < window
    if chunk is not None:
        allowed &= i[:, None] // chunk == i[None, :] // chunk
    return allowed[None, None]


def _window_mask(length: int, window: Optional[int], chunk: Optional[int],
                 device: torch.device) -> Optional[torch.Tensor]:
    """The bool mask of a sliding-window or chunked layer (:func:`_causal_mask`); None where the window and the chunk
    cover the whole sequence (plain causal attention, the flash kernel)."""
    if (window is None or length <= window) and (chunk is None or length <= chunk):
        return None
    return _causal_mask(length, window, chunk, device)


def packed_eager_mask(*args, **kwargs) -> Optional[torch.Tensor]:
    """As :func:`packed_sdpa_mask`, with ``masking_utils.eager_mask`` (an additive float mask) for padded batches."""
    return _packed_mask(eager_mask, *args, **kwargs)


def packed_eager_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                           scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                           position_ids: Optional[torch.Tensor] = None, **kwargs) -> tuple[torch.Tensor, None]:
    """:func:`packed_sdpa_attention` with the model's own ``eager_attention_forward`` (the function its modeling
    module defines, what ``attn_implementation="eager"`` runs: attention sinks ``s_aux``, soft-caps and other terms
    SDPA has no argument for): one call per sequence of a packed row with its additive causal (and window) mask; a
    call that is not over one packed row goes to that function unchanged. Same shapes as
    :func:`packed_sdpa_attention`. Raises ``TypeError`` for a module whose modeling module defines no
    ``eager_attention_forward``."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise TypeError(f"{type(module).__name__}: its modeling module has no eager_attention_forward for "
                        f"{PACKED_EAGER}")
    lengths = packed_lengths(module, query, key, attention_mask, is_causal, position_ids)
    if lengths is None:
        return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)[0], None
    window, chunk = kwargs.get("sliding_window"), attention_chunk(module)
    floor = torch.finfo(query.dtype).min
    outputs = []
    for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2)):
        allowed = _causal_mask(q.shape[2], window, chunk, q.device)
        additive = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, floor)
        outputs.append(eager(module, q, k, v, additive, dropout=dropout, scaling=scaling, **kwargs)[0])
    return torch.cat(outputs, dim=1), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
AttentionMaskInterface.register(PACKED_SDPA, packed_sdpa_mask)
AttentionInterface.register(PACKED_EAGER, packed_eager_attention)
AttentionMaskInterface.register(PACKED_EAGER, packed_eager_mask)
