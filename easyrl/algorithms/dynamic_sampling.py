"""DAPO dynamic sampling (Yu et al. 2025, arXiv:2503.14476, Sec. 3.2): drop the groups whose samples all got the same
reward (every group-relative advantage is 0); the trainer refills the batch."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["select_groups"]


def select_groups(values: np.ndarray | torch.Tensor, index: np.ndarray, *, filter_low: float | None = None,
                  filter_high: float | None = None) -> np.ndarray:
    """``(bsz,)`` bool: keep the samples whose group's ``values`` (score or accuracy, ``(bsz,)``, grouped by ``index``)
    are not all equal and whose group mean lies in ``[filter_low, filter_high]`` (None: unbounded).
    ValueError on mismatched or non-1-D inputs or ``filter_low > filter_high``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    values = np.asarray(values, dtype=np.float64)
    index = np.asarray(index)
    if values.ndim != 1 or index.shape != values.shape:
        raise ValueError(
            f"select_groups: values and index must both be (bsz,); got {values.shape} and {index.shape}"
        )
    if filter_low is not None and filter_high is not None and filter_low > filter_high:
        raise ValueError(f"select_groups: filter_low ({filter_low}) must be <= filter_high ({filter_high})")
    if values.size == 0:
        return np.zeros(0, dtype=bool)
    _, group = np.unique(index, return_inverse=True)
    group = group.reshape(-1)
    n_groups = int(group.max()) + 1
    group_min = np.full(n_groups, np.inf)
    group_max = np.full(n_groups, -np.inf)
    np.minimum.at(group_min, group, values)
    np.maximum.at(group_max, group, values)
    group_mean = np.bincount(group, weights=values, minlength=n_groups) / np.bincount(group, minlength=n_groups)
    keep = group_max > group_min
    if filter_low is not None:
        keep &= group_mean >= filter_low
    if filter_high is not None:
        keep &= group_mean <= filter_high
    return keep[group]

