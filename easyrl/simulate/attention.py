"""The device's attention kernels on simulated devices (output + log-sum-exp, not the math path's ``(batch, heads,
S, S)`` weights); which kernel runs where: docs/simulate.md, "The device's attention kernels". A Qwen-VL model there
("Images"): the vision tower's attention as one varlen call per block, and image-token masks that keep their real
values (Qwen3-VL's DeepStack indexes with them)."""

from __future__ import annotations

import contextlib
import itertools
import types
from typing import Iterator, Optional
from unittest import mock

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from easyrl.models.packed_attention import packed_lengths, packed_sdpa_mask

__all__ = ["SIMULATED_VARLEN", "VISION_VARLEN", "deepstack_by_positions", "device_attention", "fused_sdpa",
           "simulated_varlen_attention", "simulated_vl", "varlen_flash", "varlen_vision_attention"]

SIMULATED_VARLEN = "easyrl_simulated_varlen"
"""The ``attn_implementation`` name standing for ``flash_attention_2`` on simulated devices (a name without "flash":
transformers would try to import the ``flash_attn`` package for one)."""

_math_sdpa = torch.nn.functional.scaled_dot_product_attention


def fused_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
               enable_gqa: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` as CUDA runs it: flash without a mask in bf16/fp16 (head dim <= 256), else
    memory-efficient with the mask as a bias, the math path where CUDA takes it too. ``query``: ``(batch, heads, Sq,
    head_dim)``; ``key``, ``value``: ``(batch, kv_heads, Sk, head_dim)``; ``attn_mask``: None, boolean (True =
    attend) or additive, broadcastable to ``(batch, heads, Sq, Sk)``. Returns ``(batch, heads, Sq, head_dim)`` in the
    query's dtype."""
    flash = attn_mask is None and query.dtype in (torch.bfloat16, torch.float16) and query.shape[-1] <= 256
    gqa = enable_gqa and key.shape[-3] != query.shape[-3]  # only the flash kernel takes grouped-query heads
    if query.dtype == torch.float64 or query.shape[-1] % 8 or query.dim() != 4 or (gqa and not flash):
        return _math_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                          scale=scale, enable_gqa=enable_gqa)
    if flash:
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                                  scale=scale)[0]
    bias = attn_mask
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:  # SDPA's convert_boolean_attn_mask: 0 where True, -inf where False
            bias = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(attn_mask.logical_not(), float("-inf"))
        bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))  # as SDPA: for backward only
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, bias, lse, dropout_p,
                                                                  is_causal, scale=scale)[0]


def simulated_varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                               scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                               position_ids: Optional[torch.Tensor] = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function: the varlen flash kernel over one packed row, its sequences read off the
    position ids ``(1, total)`` (restarting at 0 at each sequence). ``query``: ``(1, heads, total, head_dim)``;
    ``key``, ``value``: ``(1, kv_heads, total, head_dim)``; returns ``((1, total, heads, head_dim), None)``. Other
    calls (a mask, several rows, a vision tower, decoding) go to ``sdpa_attention_forward``."""
    lengths = packed_lengths(module, query, key, attention_mask, is_causal, position_ids)
    if lengths is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=query.device)
    return varlen_flash(query, key, value, cu_seqlens, cu_seqlens, max(lengths), max(lengths), dropout, True,
                        scaling, kwargs.get("sliding_window")), None


def varlen_flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, max_q: int, max_k: int, dropout: float, causal: bool,
                 scale: Optional[float], window: Optional[int] = None) -> torch.Tensor:
    """``aten._flash_attention_forward`` (fake kernels for it and its backward) over the pieces of one row that
    ``cu_seqlens_q/k`` (``(pieces + 1,)`` int32 boundaries) mark; ``query`` ``(1, heads, total, head_dim)``, ``key``,
    ``value`` ``(1, kv_heads, total, head_dim)``, ``window`` a causal sliding window (tokens) or None. Returns
    ``(1, total, heads, head_dim)``; the float32 log-sum-exp ``(heads, total)`` stays for the backward."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, dropout, causal, False, scale=scale,
        window_size_left=window - 1 if window is not None else None, window_size_right=0 if window else None)[0]
    return out.unsqueeze(0)


AttentionInterface.register(SIMULATED_VARLEN, simulated_varlen_attention)
AttentionMaskInterface.register(SIMULATED_VARLEN, packed_sdpa_mask)


@contextlib.contextmanager
def device_attention(kind: str) -> Iterator[None]:
    """Inside: the attention of a ``kind`` (``cuda`` / ``npu``) device with ``flash_attn`` installed, for the actor's
    choice (:data:`SIMULATED_VARLEN` for ``flash_attention_2``) and SDPA's (:func:`fused_sdpa`)."""
    from easyrl.workers import trainable
    from easyrl.workers.policy_forward import attention_implementation

    def simulated_choice(device: str, padding_free: bool, param_dtype: str, flash_available: bool,
                         windowed: bool, sdpa: bool = True, chunked: bool = False) -> str:
        attn = attention_implementation(kind, padding_free, param_dtype, True, windowed, sdpa, chunked)
        return SIMULATED_VARLEN if attn == "flash_attention_2" else attn

    with mock.patch.object(trainable, "attention_implementation", simulated_choice), \
            mock.patch.object(trainable, "is_flash_attn_2_available", lambda: True), \
            mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", fused_sdpa):
        yield


VISION_VARLEN = "easyrl_simulated_flash_vision"
"""The vision tower's ``_attn_implementation`` on simulated devices ("flash" in it: the ``cu_seqlens`` path)."""


def varlen_vision_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None,
                            dropout: float = 0.0, cu_seq_lens_q: Optional[torch.Tensor] = None,
                            cu_seq_lens_k: Optional[torch.Tensor] = None, max_length_q=None, max_length_k=None,
                            is_causal: bool = False, **_) -> tuple[torch.Tensor, None]:
    """transformers' flash attention of a vision block: ``query``, ``key``, ``value`` ``(1, heads, patches,
    head_dim)``, ``cu_seq_lens_q/k`` ``(pieces + 1,)`` boundaries; returns ``((1, patches, heads, head_dim), None)``."""
    return varlen_flash(query, key, value, cu_seq_lens_q.to(torch.int32), cu_seq_lens_k.to(torch.int32),
                        int(max_length_q), int(max_length_k), dropout, is_causal, scaling), None


AttentionInterface.register(VISION_VARLEN, varlen_vision_attention)


def _token_masks(model: torch.nn.Module):
    """``model.get_placeholder_mask`` (its checks included) returning ``(bsz, tokens, 1)`` masks from
    ``input_ids``, small enough to keep their real values (``SHADOW_LIMIT``)."""
    original = model.get_placeholder_mask
    config = model.config

    def get_placeholder_mask(input_ids, inputs_embeds, *args, **kwargs):
        masks = original(input_ids, inputs_embeds, *args, **kwargs)
        if input_ids is None:
            return masks
        return tuple((input_ids == getattr(config, key)).unsqueeze(-1).to(inputs_embeds.device)
                     for key in ("image_token_id", "video_token_id"))

    return get_placeholder_mask


def deepstack_by_positions(self, hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor,
                           visual_embeds: torch.Tensor) -> torch.Tensor:
    """Qwen3-VL's ``_deepstack_process`` indexing by the image tokens' positions (fake tensors cannot size a
    boolean mask): ``hidden_states`` ``(bsz, tokens, hidden)``, ``visual_pos_masks`` ``(bsz, tokens)`` bool (True at
    image/video tokens), ``visual_embeds`` ``(visual tokens, hidden)`` in the mask's row-major order."""
    rows, cols = visual_pos_masks.to(hidden_states.device).nonzero(as_tuple=True)
    visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
    hidden_states = hidden_states.clone()
    hidden_states[rows, cols, :] = hidden_states[rows, cols, :] + visual_embeds
    return hidden_states


@contextlib.contextmanager
def simulated_vl() -> Iterator[None]:
    """Inside: every VL model ``build_empty_model`` builds uses :data:`VISION_VARLEN`, :func:`_token_masks` and
    :func:`deepstack_by_positions`."""
    import easyrl.workers.fsdp_model as fsdp_model

    build = fsdp_model.build_empty_model

    def build_empty_model(*args, **kwargs):
        model = build(*args, **kwargs)
        inner = getattr(model, "model", None)
        if getattr(inner, "visual", None) is not None:
            inner.visual.config._attn_implementation = VISION_VARLEN
            inner.get_placeholder_mask = _token_masks(inner)
            language = getattr(inner, "language_model", None)
            if hasattr(language, "_deepstack_process"):
                language._deepstack_process = types.MethodType(deepstack_by_positions, language)
        return model

    with mock.patch.object(fsdp_model, "build_empty_model", build_empty_model):
        yield
