"""A Qwen-VL model on simulated devices: the vision tower's attention as one varlen call per block (as
flash-attention runs it), and image-token masks that keep their real values.

A Qwen-VL vision block attends within each image (Qwen3-VL, and Qwen2.5-VL's full-attention blocks) or within each
``window_size`` window of 8 x 8 patches (Qwen2.5-VL's other blocks). With a flash attention implementation
transformers passes the block the ``cu_seqlens`` of those pieces in one call; with any other it splits the patches
into one SDPA call per piece: 16 images of 88 x 88 patches are 1,936 windows, ~54,000 SDPA calls per forward of
Qwen2.5-VL-7B's tower, minutes of fake-tensor dispatch on this CPU for memory that is the same either way (the
device's kernels, flash or memory-efficient, keep each call's output and a log-sum-exp, never the
``patches x patches`` weights). :func:`varlen_vision_attention` runs every piece of a block in one
``aten._flash_attention_forward`` with ``cum_seq_q/k`` (torch has fake/meta kernels for it and its backward, on
fake ``cuda`` and fake CPU tensors): output ``(patches, heads, head_dim)`` and a float32 log-sum-exp ``(heads,
patches)``; :func:`simulated_vl` sets it as the vision tower's attention of every model built inside it (after
the model is built: a name with "flash" makes transformers take the ``cu_seqlens`` path, and would make it look for
the ``flash_attn`` package at build time).

The model's ``get_placeholder_mask`` returns ``(bsz, tokens, 1)`` masks of the image (video) pad tokens, not the
``(bsz, tokens, hidden)`` expanded views it returns on a device: ``masked_scatter`` broadcasts them to the same
result, and Qwen3-VL's DeepStack (``image_mask[..., 0]``, then ``hidden_states[visual_pos_masks, :]``) indexes with
a mask that keeps its real host value: a view's element count is what ``SimulatedDevice`` weighs against its
``SHADOW_LIMIT``, and the expanded view of 65,536 tokens x 4096 is far above it, so its ``[..., 0]`` had no real
values. The DeepStack step itself (``_deepstack_process``: the vision features of three tower blocks added to the
image tokens' hidden states after the first decoder layers) indexes the ``(1, tokens, hidden)`` hidden states with
that boolean mask, which fake tensors cannot size (``meta_index_Tensor`` calls ``nonzero`` below
``SimulatedDevice``: ``DynamicOutputShapeException``); :func:`deepstack_by_positions` does the same with the mask's
positions (``nonzero`` of the small mask, which ``SimulatedDevice`` answers from its real values), the same tensors
and the same result.
"""

from __future__ import annotations

import contextlib
import types
from typing import Iterator, Optional
from unittest import mock

import torch
from transformers import AttentionInterface

from easyrl.simulate.attention import varlen_flash

__all__ = ["VISION_VARLEN", "deepstack_by_positions", "simulated_vl", "varlen_vision_attention"]

VISION_VARLEN = "easyrl_simulated_flash_vision"
"""The vision tower's ``_attn_implementation`` on simulated devices ("flash" in it: the ``cu_seqlens`` path)."""


def varlen_vision_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None,
                            dropout: float = 0.0, cu_seq_lens_q: Optional[torch.Tensor] = None,
                            cu_seq_lens_k: Optional[torch.Tensor] = None, max_length_q=None, max_length_k=None,
                            is_causal: bool = False, **_) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature, as its flash path calls it from a vision block.

    Args:
        query, key, value: ``(1, heads, patches, head_dim)``.
        cu_seq_lens_q, cu_seq_lens_k: ``(pieces + 1,)`` int32 boundaries of the images or windows.
        max_length_q, max_length_k: the longest piece (int or 0-dim tensor).

    Returns:
        ``((1, patches, heads, head_dim), None)``, as transformers' flash attention returns it.
    """
    return varlen_flash(query, key, value, cu_seq_lens_q.to(torch.int32), cu_seq_lens_k.to(torch.int32),
                        int(max_length_q), int(max_length_k), dropout, is_causal, scaling), None


AttentionInterface.register(VISION_VARLEN, varlen_vision_attention)


def _token_masks(model: torch.nn.Module):
    """``model.get_placeholder_mask`` (its count checks included) returning ``(bsz, tokens, 1)`` masks computed
    from ``input_ids`` (module docstring)."""
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
    """Qwen3-VL's ``_deepstack_process`` with the image tokens' positions for an index (module docstring).

    Args:
        hidden_states: ``(bsz, tokens, hidden)``.
        visual_pos_masks: ``(bsz, tokens)`` bool, True at image/video tokens.
        visual_embeds: ``(visual tokens, hidden)``, in the mask's row-major order.
    """
    rows, cols = visual_pos_masks.to(hidden_states.device).nonzero(as_tuple=True)
    visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
    hidden_states = hidden_states.clone()
    hidden_states[rows, cols, :] = hidden_states[rows, cols, :] + visual_embeds
    return hidden_states


@contextlib.contextmanager
def simulated_vl() -> Iterator[None]:
    """Inside: every model ``easyrl.workers.fsdp_model.build_empty_model`` builds with a vision tower runs its
    attention with :data:`VISION_VARLEN`, returns ``(bsz, tokens, 1)`` placeholder masks and (Qwen3-VL) adds its
    DeepStack features by position (module docstring); a text model is left as built."""
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
