"""The rule reward of a run scored by a reward model alone (``worker.reward.reward_function: null``): 0 per sample."""

from __future__ import annotations

from typing import Any

REWARD_TYPE = "batch"
SPEC = f"{__file__}:zero_reward"  # what the pre-flight loads in place of a missing reward function


def zero_reward(reward_inputs: list[dict[str, Any]], **kwargs: Any) -> list[dict[str, float]]:
    """``{"overall": 0.0}`` for every reward input (``worker.reward.reward_function_kwargs`` are ignored)."""
    return [{"overall": 0.0} for _ in reward_inputs]
