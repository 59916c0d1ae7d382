"""Reductions over the valid (mask == 1) entries of a tensor.

Masks are ``{0, 1}`` tensors (bool, int or float) of the values' shape. Entries where the mask is 0 never influence a
result, even NaN or inf (``torch.where`` replaces them by 0 first). ``dim=None`` reduces to a 0-dim tensor.
"""

from __future__ import annotations

import torch

__all__ = ["masked_sum", "masked_mean", "masked_whiten"]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of ``values`` over ``dim`` where ``mask`` is non-zero; 0 where no entry is valid."""
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Mean of ``values`` over ``dim`` where ``mask`` is non-zero; 0 (not NaN) for an empty row."""
    count = mask.bool().sum(dim=dim).to(values.dtype).clamp(min=1)
    return masked_sum(values, mask, dim) / count


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(values - mean) / sqrt(var + eps)`` with the mean and unbiased variance of the valid entries; entries outside
    the mask are transformed too (multiply by the mask to zero them). ValueError for fewer than 2 valid entries."""
    n = int(mask.bool().sum())
    if n < 2:
        raise ValueError(f"masked_whiten needs at least 2 valid entries, the mask has {n}; use a larger batch")
    mean = masked_mean(values, mask)
    var = masked_sum((values - mean) ** 2, mask) / (n - 1)
    return (values - mean) * torch.rsqrt(var + eps)
