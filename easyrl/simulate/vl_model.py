"""A Qwen-VL model on simulated devices (docs/simulate.md, "Images"): the vision tower's attention as one varlen call
per block, and image-token masks that keep their real values (Qwen3-VL's DeepStack indexes with them)."""

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
    boolean mask).

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
