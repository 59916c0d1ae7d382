"""The reward function in a Ray actor, so that scoring overlaps the workers' log-prob passes (``timing_s/reward`` is
the time still waited); functions are loaded once per (spec, kwargs, reward_type, on_error, timeout_s)."""

from __future__ import annotations

from typing import Any, Optional

from easyrl.rewards.function import RewardFunction
from easyrl.rewards.guard import GuardedReward, RewardFailure

__all__ = ["RewardScorer"]


class RewardScorer:
    """Scores reward inputs with a guarded :class:`RewardFunction` (run it as ``ray.remote(RewardScorer)``)."""

    def __init__(self) -> None:
        self._guards: dict[tuple, GuardedReward] = {}

    def score_guarded(self, spec: str, kwargs: dict, reward_type: str, inputs: list[dict[str, Any]], on_error: str,
                      timeout_s: Optional[float], step: int) -> tuple[dict[str, list[float]], list[RewardFailure]]:
        """The scores and failures of a guarded ``RewardFunction(spec, kwargs, reward_type)``; raises as
        :class:`GuardedReward`."""
        key = (spec, repr(sorted(kwargs.items())), reward_type, on_error, timeout_s)
        if key not in self._guards:
            self._guards[key] = GuardedReward(RewardFunction(spec, kwargs, reward_type), on_error, timeout_s)
        return self._guards[key](inputs, step)
