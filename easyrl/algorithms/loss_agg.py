"""Loss aggregation: the per-token loss matrix to the scalar a micro-batch back-propagates (``loss_agg_mode``).

Global normalisation (what makes the loss independent of how a mini-batch is split): a mini-batch is split over
``dp_size`` data-parallel ranks and, on each rank, into micro-batches whose gradients are *summed*
(accumulated); the FSDP all-reduce then *averages* over ranks. If every micro-batch divides by the
denominator of the whole mini-batch (``global_num_tokens`` / ``global_num_seqs``, counted over all ranks)
and multiplies by ``dp_size``, then::

    mean_over_ranks( sum_over_micro_batches( agg_loss(micro, global counts, dp_size) ) ) == agg_loss(mini-batch)

for the value and for the gradient (``tests/test_losses.py`` checks both). Per-micro-batch means would instead
weight a token by ``1 / tokens in its micro-batch``, which depends on the split.
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
    """Local denominators of :func:`agg_loss` for one rank's share of a mini-batch.

    Args:
        loss_mask: ``(bsz, resp_len)`` ``{0, 1}``.

    Returns:
        ``(num_tokens, num_seqs)``: valid tokens, and sequences with at least one valid token. Sum them over the
        micro-batches of a rank and all-reduce (sum) over ranks to get ``global_num_tokens``/``global_num_seqs``.
    """
    valid = loss_mask.bool()
    return int(valid.sum()), int(valid.any(dim=-1).sum())


def _denominator(global_count, local_count: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    count = local_count if global_count is None else global_count
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp(min=1)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    global_num_tokens: int | torch.Tensor | None = None,
    global_num_seqs: int | torch.Tensor | None = None,
    dp_size: int = 1,
    norm_length: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix to the scalar a micro-batch back-propagates.

    Modes (``m`` the mask, ``n_i = sum_t m_it``, ``T`` the number of valid tokens, ``S`` the number of
    sequences with ``n_i > 0``, both over the whole mini-batch when the global counts are given):

    * ``"token-mean"``: ``sum_it m_it l_it / T``. Every token weighs the same (DAPO's token-level loss,
      Yu et al. 2025, arXiv:2503.14476, Sec. 3.3).
    * ``"seq-mean-token-sum"``: ``sum_i (sum_t m_it l_it) / S``.
    * ``"seq-mean-token-mean"``: ``sum_i (sum_t m_it l_it / n_i) / S`` (the original GRPO objective,
      Shao et al. 2024, Eq. 3: ``1/G sum_i 1/|o_i| sum_t``).
    * ``"token-sum"``: ``sum_it m_it l_it``, no normalisation (the loss scale grows with the mini-batch).
    * ``"seq-mean-token-sum-norm"``: ``sum_i (sum_t m_it l_it / L) / S``, Dr. GRPO's length-unbiased loss (Liu et
      al. 2025, arXiv:2503.20783, Sec. 3.1, and its reference implementation sail-sg/oat: divide by the generation
      budget ``L = norm_length`` (default ``loss_mat.shape[-1]``, the padded response length) instead of ``|o_i|``,
      average over the ``G`` sequences). ``"seq-mean-token-sum-norm-drgrpo"`` is the same.

    Pass the configured max response length as ``norm_length`` when micro-batches may be padded to different
    lengths, otherwise the constant ``L`` differs between them.

    Every mode is then multiplied by ``dp_size`` (see the module docstring). Empty denominators count as 1, so a
    micro-batch without valid tokens gives 0.

    Args:
        loss_mat: ``(bsz, resp_len)`` per-token loss; ``loss_mask`` the same shape, ``{0, 1}``.
        global_num_tokens: valid tokens in the whole mini-batch over all ranks (``None``: this batch's count).
        global_num_seqs: sequences with >= 1 valid token in the whole mini-batch over all ranks (``None``: local).
        dp_size: number of data-parallel ranks averaging gradients.

    Returns:
        0-dim tensor.

    Raises:
        ValueError: for an unknown mode (the message lists the valid ones) or mismatched shapes.
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
