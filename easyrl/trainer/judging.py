"""The trainer's judge phase (``worker.reward.judge``, docs/judge.md): one judge prompt per sample answered by the
workers' judge engines, the verdicts parsed into ``score/judge``: ``overall = reward overall + weight x judge``."""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.rewards.function import scores_to_token_rewards
from easyrl.rewards.judge import Judge, load_judge
from easyrl.trainer.scoring import Scorer
from easyrl.workers.fsdp_worker import FSDPWorker

__all__ = ["JudgePhase", "add_judge_scores"]

logger = logging.getLogger("easyrl.judge")


def add_judge_scores(batch: Batch, scores: list[float], weight: float) -> None:
    """Put ``score/judge`` in ``batch`` and add ``weight x score`` to ``score/overall`` and to ``token_level_scores``
    (on each response's last token, where the reward function's overall is; shape ``(bsz, resp_len)``)."""
    judged = torch.tensor(scores, dtype=torch.float32)
    batch["token_level_scores"] = batch["token_level_scores"] + scores_to_token_rewards(weight * judged,
                                                                                        batch["response_mask"])
    batch["score/overall"] = [overall + weight * score for overall, score in zip(batch["score/overall"], scores)]
    batch["score/judge"] = list(map(float, scores))


class JudgePhase:
    """Owns the judge's prompt and parser and the last verdicts; ``scorer`` decodes the responses."""

    def __init__(self, judge: Judge, scorer: Scorer, workers: Any):
        self.judge = judge
        self.scorer = scorer
        self.workers = workers
        self.verdicts: list[Optional[str]] = []

    @classmethod
    def create(cls, config: Any, scorer: Scorer, workers: Any) -> Optional["JudgePhase"]:
        """The phase for ``worker.reward.judge``, or None when the judge is off (``model_path`` null).

        Raises:
            ConfigError: a bad prompt template or parser (``easyrl.rewards.judge``).
        """
        judge = load_judge(config)
        return None if judge is None else cls(judge, scorer, workers)

    def run(self, batch: Batch) -> dict[str, float]:
        """Judge every sample of ``batch`` and add the scores (raw verdicts in ``batch["judge_verdict"]``, the first
        unreadable one warned of); returns ``{"judge/unparseable": count}``."""
        prompts = self.judge.prompts(self.scorer.reward_inputs(batch))
        requests = Batch(TensorDict({}, batch_size=[len(prompts)]), {"judge_prompt": prompts})
        self.verdicts = [v for share in self.workers.run_split(FSDPWorker.judge, requests) for v in share]
        scores, unparseable = self.judge.scores(self.verdicts)
        add_judge_scores(batch, scores, self.judge.config.weight)
        batch["judge_verdict"] = self.verdicts  # for the generations table (easyrl.trainer.metrics.generation_rows)
        if unparseable:
            first = next(v for v in self.verdicts if self.judge.scores([v])[1])
            logger.warning("judge: %d of %d verdicts unreadable by worker.reward.judge.parser=%s, e.g. %r (None: the "
                           "prompt did not fit max_model_len)", unparseable, len(scores), self.judge.config.parser,
                           first)
        return {"judge/unparseable": float(unparseable)}
