"""The random generator states of one process, saved with a checkpoint and restored on resume."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def get_rng_state() -> dict[str, Any]:
    """This process's Python, NumPy and torch (CPU and, if any, CUDA/NPU) generator states."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        state["npu"] = npu.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    if "npu" in state:
        torch.npu.set_rng_state(state["npu"])
