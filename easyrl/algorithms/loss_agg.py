"""Loss aggregation (``loss_agg_mode``): the per-token loss matrix to the scalar a micro-batch back-propagates.

Global normalisation: micro-batch gradients are summed on a rank and averaged over ``dp_size`` ranks, so when every
micro-batch divides by the whole mini-batch's denominator (``global_num_tokens``/``global_num_seqs``, over all ranks)
and multiplies by ``dp_size``, the value and gradient equal ``agg_loss(mini-batch)`` whatever the split.
"""

from __future__ import annotations

import torch

from easyrl.algorithms.masked_ops import masked_sum

__all__ = ["LOSS_AGG_MODES", "agg_loss", "mask_counts"]

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "seq-mean-token-sum-norm-drgrpo",
)

def mask_counts(loss_mask: torch.Tensor) -> tuple[int, int]:
    """``(num_tokens, num_seqs)`` of a ``(bsz, resp_len)`` mask: valid tokens and sequences with one or more; summed
    over micro-batches and ranks they are ``global_num_tokens``/``global_num_seqs``."""
    valid = loss_mask.bool()
    return int(valid.sum()), int(valid.any(dim=-1).sum())


def _denominator(global_count, local_count: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    count = local_count if global_count is None else global_count
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp(min=1)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, *,
             global_num_tokens: int | torch.Tensor | None = None, global_num_seqs: int | torch.Tensor | None = None,
             dp_size: int = 1, norm_length: int | None = None) -> torch.Tensor:
    """The 0-dim loss of ``loss_mat`` ``(bsz, resp_len)`` under ``loss_mask`` (same shape), times ``dp_size``.

    ``n_i = sum_t m_it``; ``T`` valid tokens and ``S`` sequences with ``n_i > 0`` (the global counts when given, else
    this batch's; an empty denominator counts as 1):
    ``token-mean`` ``sum_it m l / T`` (DAPO, arXiv:2503.14476, Sec. 3.3); ``seq-mean-token-sum``
    ``sum_i (sum_t m l) / S``; ``seq-mean-token-mean`` ``sum_i (sum_t m l / n_i) / S`` (GRPO, arXiv:2402.03300,
    Eq. 3); ``token-sum`` ``sum_it m l``; ``seq-mean-token-sum-norm`` (= ``-drgrpo``) ``sum_i (sum_t m l / L) / S``
    with ``L = norm_length`` or ``loss_mat.shape[-1]`` (Dr. GRPO, arXiv:2503.20783, Sec. 3.1; pass the max
    response length when micro-batches are padded differently). ValueError for an unknown mode (listing the valid
    ones) or mismatched shapes.
    """
    if loss_mat.shape != loss_mask.shape or loss_mat.dim() != 2:
        raise ValueError(
            f"agg_loss: loss_mat and loss_mask must both be (bsz, resp_len); got {tuple(loss_mat.shape)} "
            f"and {tuple(loss_mask.shape)}"
        )
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {list(LOSS_AGG_MODES)}")
    valid = loss_mask.bool()
    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, valid) / _denominator(global_num_tokens, valid.sum(), loss_mat) * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, valid) * dp_size
    seq_valid = valid.any(dim=-1)
    seq_loss = masked_sum(loss_mat, valid, dim=-1)  # (bsz,)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_loss = seq_loss / valid.sum(dim=-1).clamp(min=1).to(seq_loss.dtype)
    elif loss_agg_mode.startswith("seq-mean-token-sum-norm"):
        seq_loss = seq_loss / (loss_mat.shape[-1] if norm_length is None else norm_length)
    return masked_sum(seq_loss, seq_valid) / _denominator(global_num_seqs, seq_valid.sum(), loss_mat) * dp_size
