"""Padding-free (packed) model inputs: the one translation between the padded batch layout and packed rows.

Padded batches (``(bsz, P + R)``: left-padded prompts, right-padded responses) become one row ``(1, total)`` of valid
tokens, positions restarting at 0 per sequence, from which transformers reads the boundaries when
``attention_mask=None`` (a block-diagonal mask for SDPA/eager, ``cu_seqlens`` for flash varlen). Qwen-VL's
``(4, 1, total)`` positions hold the text row, then the 3-D mRoPE rows. ``cu_seq_lens_q`` & co. are not passed:
Qwen-VL would forward them to its vision tower. Scores return via ``logit_indices`` and ``PackedBatch.unpack``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["PackedBatch", "pack_sequences", "padded_text_positions"]


def padded_text_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(bsz, L)`` positions counting only real tokens of ``attention_mask`` ``(bsz, L)`` (0 at left padding), as
    vLLM sees them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class PackedBatch:
    """One packed row holding the valid tokens of ``bsz`` padded sequences.

    Attributes:
        input_ids: ``(1, total)``; position_ids: ``(1, total)`` or mRoPE's ``(4, 1, total)`` (text row, 3 rotary rows).
        cu_seqlens: ``(bsz + 1,)`` int32 sequence offsets (flash-attention varlen style); max_seqlen: the longest.
        logit_indices, labels, rows, cols: ``(num_response_tokens,)`` packed positions scoring a response token
            (``logits_to_keep``), the tokens scored there, and where each sits in the padded ``(bsz, R)`` layout.
        response_shape: ``(bsz, R)``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    logit_indices: torch.Tensor
    labels: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    response_shape: tuple[int, int]

    @property
    def num_tokens(self) -> int:
        """Valid tokens in the packed row."""
        return int(self.input_ids.shape[-1])

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """Scatter ``values`` ``(num_response_tokens,)`` (or ``(1, n)``) back to the padded layout: ``(bsz, R)`` of
        ``values.dtype``, 0 at padding, differentiable. ValueError for another number of values."""
        values = values.reshape(-1)
        if values.shape[0] != self.labels.shape[0]:
            raise ValueError(f"unpack got {values.shape[0]} values for {self.labels.shape[0]} response tokens")
        out = values.new_zeros(self.response_shape)
        return out.index_put((self.rows, self.cols), values)


def pack_sequences(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                   positions: Optional[torch.Tensor] = None, mrope: bool = False,
                   text_positions: Optional[torch.Tensor] = None) -> PackedBatch:
    """Pack left-padded prompt + right-padded response rows, ``input_ids`` and ``attention_mask`` (1 at real tokens)
    ``(bsz, P + R)``, into one :class:`PackedBatch` row without padding (on ``input_ids.device``).
    ``response_mask`` ``(bsz, R)`` marks the response tokens to score (a prefix of each row); ``positions``: None for
    1-D positions, or Qwen-VL's ``(3, bsz, P + R)`` mRoPE positions; ``mrope`` without ``positions``: the three
    rotary rows repeat the text positions (Qwen-VL builds no packed mask from 2-D position ids);
    ``text_positions`` ``(bsz, P + R)``: the family's ``positions`` hook (None: :func:`padded_text_positions`).
    ValueError: mismatched shapes, a response token outside ``attention_mask``, or an empty prompt.
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
                         "must both be (bsz, prompt_len + resp_len)")
    bsz, length = input_ids.shape
    if response_mask.dim() != 2 or response_mask.shape[0] != bsz or response_mask.shape[1] >= length:
        raise ValueError(f"response_mask {tuple(response_mask.shape)} must be (bsz={bsz}, resp_len < {length})")
    resp_len = response_mask.shape[1]
    prompt_len = length - resp_len
    valid = attention_mask.bool()
    if (response_mask.bool() & ~valid[:, prompt_len:]).any():
        raise ValueError("response_mask marks tokens that attention_mask masks out")
    # packed index of every valid padded position (row-major order keeps each sequence contiguous)
    flat_index = valid.reshape(-1).long().cumsum(0).sub_(1).view(bsz, length)
    seq_lens = valid.sum(-1)
    cu_seqlens = torch.zeros(bsz + 1, dtype=torch.int32, device=input_ids.device)
    cu_seqlens[1:] = seq_lens.cumsum(0)
    if text_positions is None:
        text_positions = padded_text_positions(attention_mask)
    text_positions = text_positions[valid].unsqueeze(0)
    if positions is None and mrope:
        position_ids = text_positions.expand(4, -1).unsqueeze(1)
    elif positions is None:
        position_ids = text_positions
    else:
        if positions.shape != (3, bsz, length):
            raise ValueError(f"positions must be (3, bsz, seq_len) = (3, {bsz}, {length}), "
                             f"got {tuple(positions.shape)}")
        rope = positions[:, valid]  # (3, total)
        position_ids = torch.cat([text_positions, rope], dim=0).unsqueeze(1)
    rows, cols = response_mask.bool().nonzero(as_tuple=True)
    source = prompt_len + cols - 1  # the padded position whose logits predict response token (row, col)
    if not valid[rows, source].all():
        bad = rows[~valid[rows, source]][0].item()
        raise ValueError(f"row {bad}: the first response token has no prompt token before it (empty prompt)")
    return PackedBatch(
        input_ids=input_ids[valid].unsqueeze(0),
        position_ids=position_ids,
        cu_seqlens=cu_seqlens,
        max_seqlen=int(seq_lens.max().item()) if bsz else 0,
        logit_indices=flat_index[rows, source],
        labels=input_ids[rows, prompt_len + cols],
        rows=rows,
        cols=cols,
        response_shape=(bsz, resp_len),
    )
