"""A Qwen-VL model on simulated devices (docs/simulate.md, "Images"): the vision tower's attention as one varlen
call per block, as flash-attention runs it (transformers' other path makes one SDPA call per image or window:
minutes of fake-tensor dispatch for the same memory), and image-token masks that keep their real values, so that
Qwen3-VL's DeepStack step can index with them on fake tensors.
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

    ``query``, ``key``, ``value``: ``(1, heads, patches, head_dim)``; ``cu_seq_lens_q/k``: ``(pieces + 1,)`` int32
    boundaries of the images or windows; ``max_length_q/k``: the longest piece. Returns ``((1, patches, heads,
    head_dim), None)``, as transformers' flash attention returns it.
    """
    return varlen_flash(query, key, value, cu_seq_lens_q.to(torch.int32), cu_seq_lens_k.to(torch.int32),
                        int(max_length_q), int(max_length_k), dropout, is_causal, scaling), None


AttentionInterface.register(VISION_VARLEN, varlen_vision_attention)


def _token_masks(model: torch.nn.Module):
    """``model.get_placeholder_mask`` (its count checks included) returning ``(bsz, tokens, 1)`` masks computed
    from ``input_ids``: ``masked_scatter`` broadcasts them as it does the device's ``(bsz, tokens, hidden)`` views,
    and they are small enough for ``SimulatedDevice`` to keep their real values (``SHADOW_LIMIT``)."""
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
    """Qwen3-VL's ``_deepstack_process`` with the image tokens' positions for an index (``nonzero`` of the small
    mask, answered from its real values) instead of the boolean mask, which fake tensors cannot size.

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
    DeepStack features by position; a text model is left as built."""
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
