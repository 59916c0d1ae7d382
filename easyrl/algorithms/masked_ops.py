"""Reductions over the valid (mask == 1) entries of a tensor.

Masks are ``{0, 1}`` tensors (bool, int or float) of the same shape as the values (any shape, e.g. ``(bsz,
resp_len)``). Entries where the mask is 0 never influence a result, even when they hold NaN or inf (they are replaced
by 0 with ``torch.where`` before any arithmetic). ``dim=None`` reduces everything to a 0-dim tensor.
"""

from __future__ import annotations

import torch

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten"]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of ``values`` over ``dim`` where ``mask`` is non-zero; 0 where no entry is valid."""
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Mean of ``values`` over ``dim`` where ``mask`` is non-zero; 0 (not NaN) where no entry is valid (an empty
    row)."""
    count = mask.bool().sum(dim=dim).to(values.dtype).clamp(min=1)
    return masked_sum(values, mask, dim) / count


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of all valid entries of ``values``, a 0-dim tensor; ``unbiased`` divides by ``n - 1`` (Bessel's
    correction, like ``torch.var``) instead of ``n``.

    Raises:
        ValueError: if no entry is valid, or only one is and ``unbiased`` is set (the variance is undefined;
            use a larger batch).
    """
    n = int(mask.bool().sum())
    if n == 0 or (unbiased and n == 1):
        raise ValueError(
            f"masked_var needs at least {2 if unbiased else 1} valid entries, the mask has {n}; "
            "use a larger batch or unbiased=False."
        )
    mean = masked_mean(values, mask)
    squared = masked_sum((values - mean) ** 2, mask)
    return squared / (n - 1 if unbiased else n)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise ``values`` to unit variance (and zero mean) using statistics of the valid entries only.

    ``out = (values - mean) / sqrt(var + eps)`` with the unbiased masked variance; with ``shift_mean=False``
    the mean is added back (only the scale changes). Entries outside the mask are transformed too (not zeroed):
    multiply by the mask when they must be 0.

    Raises:
        ValueError: from :func:`masked_var` when fewer than 2 entries are valid.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened
