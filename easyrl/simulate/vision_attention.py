"""The Qwen-VL vision tower's attention on simulated devices: one varlen call per block, as flash-attention runs it.

A Qwen-VL vision block attends within each image (Qwen3-VL, and Qwen2.5-VL's full-attention blocks) or within each
``window_size`` window of 8 x 8 patches (Qwen2.5-VL's other blocks). With a flash attention implementation
transformers passes the block the ``cu_seqlens`` of those pieces in one call; with any other it splits the patches
into one SDPA call per piece: 16 images of 88 x 88 patches are 1,936 windows, ~54,000 SDPA calls per forward of
Qwen2.5-VL-7B's tower, minutes of fake-tensor dispatch on this CPU for memory that is the same either way (the
device's kernels, flash or memory-efficient, keep each call's output and a log-sum-exp, never the
``patches x patches`` weights). :func:`varlen_vision_attention` runs every piece of a block in one
``aten._flash_attention_forward`` with ``cum_seq_q/k`` (torch has fake/meta kernels for it and its backward, on
fake ``cuda`` and fake CPU tensors): output ``(patches, heads, head_dim)`` and a float32 log-sum-exp ``(heads,
patches)``; :func:`vision_varlen` sets it as the vision tower's attention of every model built inside it (after
the model is built: a name with "flash" makes transformers take the ``cu_seqlens`` path, and would make it look for
the ``flash_attn`` package at build time).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional
from unittest import mock

import torch
from transformers import AttentionInterface

__all__ = ["VISION_VARLEN", "varlen_vision_attention", "vision_varlen"]

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
    q, k, v = (t.transpose(1, 2).squeeze(0) for t in (query, key, value))
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seq_lens_q.to(torch.int32), cu_seq_lens_k.to(torch.int32), int(max_length_q), int(max_length_k),
        dropout, is_causal, False, scale=scaling)[0]
    return out.unsqueeze(0), None


AttentionInterface.register(VISION_VARLEN, varlen_vision_attention)


@contextlib.contextmanager
def vision_varlen() -> Iterator[None]:
    """Inside: every model ``easyrl.workers.fsdp_model.build_empty_model`` builds runs its vision tower's attention
    with :data:`VISION_VARLEN` (a text model is left as built)."""
    import easyrl.workers.fsdp_model as fsdp_model

    build = fsdp_model.build_empty_model

    def build_empty_model(*args, **kwargs):
        model = build(*args, **kwargs)
        visual = getattr(getattr(model, "model", None), "visual", None)
        if visual is not None:
            visual.config._attn_implementation = VISION_VARLEN
        return model

    with mock.patch.object(fsdp_model, "build_empty_model", build_empty_model):
        yield
