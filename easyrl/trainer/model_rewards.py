"""The reward phases that run models on the workers after the reward function's scores, in training and validation
alike: the LLM judge, then the reward model, each adding its named score and weighted share of ``overall``."""

from __future__ import annotations

from typing import Any, Optional

from easyrl.batch import Batch
from easyrl.trainer.judging import JudgePhase
from easyrl.trainer.metrics import timer
from easyrl.trainer.reward_model import RewardModelScorer
from easyrl.trainer.scoring import Scorer

__all__ = ["ModelRewards"]


class ModelRewards:
    """The judge and reward-model phases (either None when off); every one of ``world_size`` workers gets an equal
    share of a batch."""

    def __init__(self, judging: Optional[JudgePhase], reward_model: Optional[RewardModelScorer], world_size: int):
        self.judging = judging
        self.reward_model = reward_model
        self.world_size = world_size

    @classmethod
    def create(cls, config: Any, scorer: Scorer, workers: Any) -> "ModelRewards":
        """The phases ``config.worker.reward`` asks for, calling ``workers`` (a ``WorkerGroup``).

        Raises:
            ConfigError: a bad judge prompt template or parser (``easyrl.rewards.judge``).
        """
        reward = config.worker.reward
        judging = JudgePhase.create(reward.judge, scorer, workers)
        reward_model = RewardModelScorer(reward.reward_model, scorer, workers) if reward.reward_model.enabled else None
        return cls(judging, reward_model, workers.world_size)

    @property
    def enabled(self) -> bool:
        """Whether any phase runs."""
        return self.judging is not None or self.reward_model is not None

    def run(self, batch: Batch, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """Score ``batch`` with the judge, then the reward model, in place, timed into ``timing``; a batch not a
        multiple of ``world_size`` is padded with copies, dropped again."""
        if not self.enabled:
            return
        real = len(batch)
        padded = batch.padded_to_multiple(self.world_size)
        if self.judging is not None:
            with timer("judge", timing):
                metrics.update(self.judging.run(padded))
        if self.reward_model is not None:
            with timer("reward_model", timing):
                self.reward_model.score(padded, metrics)
        if len(padded) > real:
            kept = padded.select(list(range(real)))
            batch["token_level_scores"] = kept["token_level_scores"]
            for key in [key for key in kept.extras if key.startswith("score/") or key == "judge_verdict"]:
                batch[key] = kept[key]
