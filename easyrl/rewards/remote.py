"""The reward function in a Ray actor, so that scoring overlaps the workers' log-prob passes.

The trainer decodes the responses, sends the reward inputs here and goes on with the old/reference log-prob passes
while the actor scores; it collects the scores before computing advantages (``timing_s/reward`` is then only the
time it still had to wait). Functions are loaded once per (spec, kwargs, reward_type, on_error, timeout_s) and
kept.
"""

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
        """``RewardFunction(spec, kwargs, reward_type)`` through a :class:`GuardedReward` (``worker.reward.on_error``,
        ``timeout_s``): returns the scores (name -> one float per input) and the samples that failed (scored 0 with
        ``on_error: zero``).

        Raises:
            RewardSampleError: a sample failed and ``on_error`` is ``raise`` (names ``step``, the sample, its
                response); the trainer re-raises it.
        """
        key = (spec, repr(sorted(kwargs.items())), reward_type, on_error, timeout_s)
        if key not in self._guards:
            self._guards[key] = GuardedReward(RewardFunction(spec, kwargs, reward_type), on_error, timeout_s)
        return self._guards[key](inputs, step)
