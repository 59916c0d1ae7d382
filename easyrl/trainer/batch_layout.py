"""The trainer's padded batch layout: ``prompts`` ``(bsz, P)`` left-padded, ``responses`` ``(bsz, R)`` right-padded,
so every response starts at column ``P`` of ``input_ids``; and what of a batch the workers need."""

from __future__ import annotations

from typing import Any, Optional

import torch

from easyrl.batch import Batch
from easyrl.workers.mm_staging import STAGE_KEY

__all__ = ["left_pad", "right_pad", "for_workers", "for_rollout"]


def left_pad(rows: list[list[int]], length: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows right-aligned in ``(len(rows), length)`` long tensors: ``(ids, mask)``, padding ``pad_id`` / 0 on
    the left.

    Raises:
        ValueError: a row is longer than ``length`` (``data.max_prompt_length``).
    """
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row) > length:
            raise ValueError(f"A prompt of {len(row)} tokens exceeds data.max_prompt_length={length}.")
        if row:
            ids[i, length - len(row):] = torch.tensor(row)
            mask[i, length - len(row):] = 1
    return ids, mask


def right_pad(rows: list[list[Any]], length: int, pad_value: Any,
              dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows left-aligned in ``(len(rows), length)``: ``(values of dtype, long mask)``, ``pad_value`` / 0 on the right;
    rows longer than ``length`` are cut."""
    values = torch.full((len(rows), length), pad_value, dtype=dtype)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        row = row[:length]
        if row:
            values[i, : len(row)] = torch.tensor(row, dtype=dtype)
            mask[i, : len(row)] = 1
    return values, mask


def for_workers(batch: Batch, staged: Optional[list[tuple[str, int]]] = None) -> Batch:
    """The tensors and processor outputs (no copy), the log-prob and update passes' share; with ``staged`` (one
    reference per sample, ``easyrl.workers.mm_staging``) the references replace the processor outputs."""
    if staged is not None:
        return Batch(batch.tensors, {STAGE_KEY: staged})
    extras = {key: batch.extras[key] for key in ("multi_modal_inputs",) if key in batch.extras}
    return Batch(batch.tensors, extras)


def for_rollout(prompts: Batch) -> Batch:
    """A prompt batch less ``multi_modal_inputs`` (vLLM takes the images) and ``columns`` (no copy)."""
    return Batch(prompts.tensors, {key: value for key, value in prompts.extras.items()
                                   if key not in ("multi_modal_inputs", "columns")})
