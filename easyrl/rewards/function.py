"""User reward functions (``worker.reward.reward_function: path/to/file.py:fn``) and their scores on response tokens.

A reward input is ``{"response": str, "response_length": int, "ground_truth": str}`` (+ the row's ``columns``); a
``batch`` function maps the list of inputs to one score dict each, a ``sequential`` one maps one input to one dict.
``overall`` is the reward, other names are logged. verl- and TRL-style functions: ``easyrl.rewards.styles``.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable

import torch

from easyrl.errors import import_user_file
from easyrl.rewards.styles import call_trl, call_verl, detect_style

REWARD_TYPES = ("batch", "sequential")
DEFAULT_FUNCTION = "main"  # when the spec names no function


def load_function(spec: str) -> tuple[Callable, str, str]:
    """``(fn, path, fn_name)`` of a spec ``path/to/file.py:fn_name`` (without ``:``, ``fn_name`` is ``main``), the file
    imported once per process. ValueError for an empty part, FileNotFoundError for a missing file, AttributeError when
    it has no callable ``fn_name`` (naming both)."""
    path, _, name = spec.rpartition(":") if ":" in spec else (spec, "", DEFAULT_FUNCTION)
    if not path or not name:
        raise ValueError(f"worker.reward.reward_function {spec!r} must be 'path/to/file.py:function_name'")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"reward function file {path!r} does not exist (worker.reward.reward_function)")
    module = import_user_file(path)
    if module is None:
        raise ValueError(f"cannot import reward function file {path!r}: is it a .py file?")
    fn = getattr(module, name, None)
    if not callable(fn):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        implied = f" (a spec without ':function_name' names {DEFAULT_FUNCTION!r}, as in EasyR1)" * (":" not in spec)
        raise AttributeError(f"reward function file {path!r} has no function {name!r}{implied}; its functions: "
                             f"{available}")
    return fn, path, name


class RewardFunction:
    """``RewardFunction(spec, kwargs, reward_type)(reward_inputs) -> {name: [float] * bsz}``; ``kwargs`` go to every
    call; ``reward_type`` ``auto`` resolves to the file's ``REWARD_TYPE``, else ``batch`` (verl style: per sample,
    TRL style: per batch). Raises as :func:`load_function`, and ValueError for an unknown ``reward_type`` or
    ``REWARD_STYLE``."""

    def __init__(self, spec: str, kwargs: dict | None = None, reward_type: str = "auto"):
        if reward_type not in REWARD_TYPES + ("auto",):
            raise ValueError(f"worker.reward.reward_type must be auto, batch or sequential, got {reward_type!r}")
        self.spec = spec
        self.fn, self.path, self.name = load_function(spec)
        self.kwargs = dict(kwargs or {})
        module = import_user_file(self.path)
        self.style = detect_style(self.fn, getattr(module, "REWARD_STYLE", None))
        if self.style != "easyrl":
            reward_type = "sequential" if self.style == "verl" else "batch"
        elif reward_type == "auto":
            reward_type = getattr(module, "REWARD_TYPE", "batch")
            if reward_type not in REWARD_TYPES:
                raise ValueError(f"{self.where}: its file's REWARD_TYPE={reward_type!r} must be one of {REWARD_TYPES}")
        self.reward_type = reward_type

    def __getstate__(self) -> dict:  # pickle by spec: the file is re-imported in the receiving process (e.g. Ray)
        return {"spec": self.spec, "kwargs": self.kwargs, "reward_type": self.reward_type}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["spec"], state["kwargs"], state["reward_type"])

    @property
    def where(self) -> str:
        return f"reward function {self.name!r} in {self.path!r}"

    def __call__(self, reward_inputs: list[dict[str, Any]]) -> dict[str, list[float]]:
        """Score name -> ``len(reward_inputs)`` floats. ValueError naming the function, file and row for a result
        of the wrong type or length, without ``overall``, with a non-finite value or other names than row 0's."""
        if self.style == "verl":
            scores = [call_verl(self.fn, reward_input, self.kwargs) for reward_input in reward_inputs]
        elif self.style == "trl":
            scores = call_trl(self.fn, reward_inputs, self.kwargs)
        elif self.reward_type == "batch":
            scores = self.fn(reward_inputs, **self.kwargs)
            if not isinstance(scores, (list, tuple)):
                raise ValueError(f"{self.where} (batch) returned a {type(scores).__name__}, expected a list of dicts")
            if len(scores) != len(reward_inputs):
                raise ValueError(
                    f"{self.where} (batch) returned {len(scores)} score dicts for {len(reward_inputs)} inputs"
                )
        else:
            scores = [self.fn(reward_input, **self.kwargs) for reward_input in reward_inputs]

        names: list[str] | None = None
        out: dict[str, list[float]] = {}
        for row, score in enumerate(scores):
            if not isinstance(score, dict):
                raise ValueError(f"{self.where} returned a {type(score).__name__} for row {row}, expected a dict")
            if "overall" not in score:
                raise ValueError(
                    f"{self.where} returned no 'overall' score for row {row} (got {sorted(score)}); "
                    "'overall' is the reward"
                )
            if names is None:
                names = list(score)
                out = {name: [] for name in names}
            elif set(score) != set(names):
                raise ValueError(
                    f"{self.where} returned names {sorted(score)} for row {row} but {sorted(names)} for row 0; "
                    "every row must have the same score names"
                )
            for name, value in score.items():
                if isinstance(value, torch.Tensor) and value.numel() == 1:
                    value = value.item()
                if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                    raise ValueError(f"{self.where} returned {name}={value!r} for row {row}: expected a finite number")
                out[name].append(float(value))
        if names is None:  # empty batch
            return {"overall": []}
        return out


def scores_to_token_rewards(overall: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(bsz, resp_len)``: each ``overall`` ``(bsz,)`` score on its row's last valid token, 0 elsewhere, in
    ``overall``'s dtype (float32 for integers). ValueError for mismatched shapes."""
    if overall.dim() != 1 or response_mask.dim() != 2 or overall.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"expected overall (bsz,) and response_mask (bsz, resp_len), got {tuple(overall.shape)} and "
            f"{tuple(response_mask.shape)}"
        )
    dtype = overall.dtype if overall.is_floating_point() else torch.float32
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values  # (bsz,), -1 when the row is empty
    rewards = torch.zeros(mask.shape, dtype=dtype, device=overall.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards[rows, last[rows]] = overall[rows].to(dtype)
    return rewards
