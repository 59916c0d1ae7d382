"""The reward phases that run models on the workers, after the reward function's scores are in the batch: the LLM
judge (``worker.reward.judge``, :class:`~easyrl.trainer.judging.JudgePhase`) and then the discriminative reward model
(``worker.reward.reward_model``, :class:`~easyrl.trainer.reward_model.RewardModelScorer`). Each adds its named score
(``score/judge``, ``score/reward_model``) and its weighted share of ``overall`` and ``token_level_scores``.

The training step and validation run the same phases, so ``val/reward/judge``, ``val/reward/reward_model`` and a
``val/reward/overall`` that includes them are reported as verl's validation does with a reward model.
"""

from __future__ import annotations

from typing import Any, Optional

from easyrl.batch import Batch
from easyrl.trainer.judging import JudgePhase
from easyrl.trainer.metrics import timer
from easyrl.trainer.reward_model import RewardModelScorer
from easyrl.trainer.scoring import Scorer

__all__ = ["ModelRewards"]


class ModelRewards:
    """The judge and reward-model phases of a run; either is None when its ``model_path`` is null.

    Args:
        judging: the judge phase, or None.
        reward_model: the reward-model phase, or None.
        world_size: the number of workers; every worker must get an equal share of a batch (the FSDP2 reward model
            gathers its shards on all ranks together).
    """

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
        """Score ``batch`` with the judge, then the reward model, in place (``token_level_scores`` ``(bsz,
        resp_len)`` and the ``score/*`` lists); adds ``timing_s/judge`` / ``timing_s/reward_model`` (seconds) to
        ``timing`` and ``judge/unparseable`` / ``reward_model/truncated`` to ``metrics``.

        A batch whose length is not a multiple of ``world_size`` (a validation set's last batch) is scored with
        copies of its first samples appended, which are dropped again (``Batch.padded_to_multiple``)."""
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
