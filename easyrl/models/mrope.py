"""Qwen-VL mRoPE positions after a video, as vLLM (and Qwen's reference code) count them.

Qwen2/2.5-VL's text after a vision segment continues at ``max(all positions so far) + 1`` (Qwen's reference
``get_rope_index``, vLLM's ``get_mrope_input_positions``); transformers continues at ``start + max(h, w)``, lower for
a video whose temporal extent ``(T - 1) * interval`` exceeds its spatial one, which shifts every later position and
log-prob (docs/models.md, "Layout notes"). :func:`text_after_vision` wraps ``get_rope_index`` to follow the reference.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

__all__ = ["continue_after_vision", "text_after_vision"]


def continue_after_vision(positions: torch.Tensor, mm_token_type_ids: torch.Tensor,
                          attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``positions`` ``(3, bsz, seq_len)`` with every text run that follows a vision run (``mm_token_type_ids`` != 0,
    ``(bsz, seq_len)``) moved to start at 1 + the largest position before it, and everything after it by as much.
    Padding (``attention_mask`` 0) is skipped and left as it is. Positions already following that rule are unchanged.
    """
    fixed = positions.clone()
    for row in range(positions.shape[1]):
        valid = (attention_mask[row].bool() if attention_mask is not None
                 else torch.ones_like(mm_token_type_ids[row], dtype=torch.bool))
        index = valid.nonzero().squeeze(1)
        types, pos = mm_token_type_ids[row, index], fixed[:, row, index]
        starts = ((types[1:] != types[:-1]).nonzero().squeeze(1) + 1).tolist()
        shift = 0
        for start, end in zip([0] + starts, starts + [len(types)]):
            pos[:, start:end] += shift
            if start > 0 and types[start] == 0 and types[start - 1] != 0:
                gap = int(pos[:, :start].max()) + 1 - int(pos[0, start])
                if gap > 0:
                    pos[:, start:end] += gap
                    shift += gap
        fixed[:, row, index] = pos
    return fixed


def text_after_vision(get_rope_index: Callable) -> Callable:
    """``get_rope_index`` of a transformers Qwen-VL model, with its positions passed through
    :func:`continue_after_vision` and its ``rope_deltas`` ``(bsz, 1)`` (largest position + 1 - length) recomputed."""

    def wrapped(input_ids: torch.Tensor, mm_token_type_ids: Optional[torch.Tensor] = None, *args, **kwargs):
        positions, deltas = get_rope_index(input_ids, mm_token_type_ids, *args, **kwargs)
        if mm_token_type_ids is None or not bool((mm_token_type_ids == 2).any()):
            return positions, deltas  # no video: nothing to correct
        mask = kwargs.get("attention_mask")
        positions = continue_after_vision(positions, mm_token_type_ids, mask)
        lengths = mask.sum(-1) if mask is not None else torch.full((input_ids.shape[0],), input_ids.shape[1])
        largest = positions.amax(dim=(0, 2)) if mask is None else torch.stack(
            [positions[:, row, mask[row].bool()].max() for row in range(input_ids.shape[0])])
        return positions, (largest + 1 - lengths.to(largest.device)).view(-1, 1).to(deltas.dtype)

    return wrapped
