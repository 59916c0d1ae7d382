"""The reward phases that run models on the workers after the reward function's scores, in training and validation
alike: the LLM judge (``worker.reward.judge``, docs/judge.md), then the reward model (``worker.reward.reward_model``,
docs/rewards.md), each adding its named score and its weighted share of ``overall``::

    overall = reward function's overall + judge.weight x score/judge + reward_model.weight x score/reward_model
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Union

import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config import RewardModelConfig
from easyrl.config.reward_model import read_chat_template
from easyrl.rewards.function import scores_to_token_rewards
from easyrl.rewards.judge import Judge, load_judge
from easyrl.rewards.reward_model_inputs import encode_conversations, load_tokenizer
from easyrl.trainer.metrics import timer
from easyrl.trainer.scoring import Scorer
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.group import WorkerGroup

__all__ = ["JudgePhase", "ModelRewards", "RewardModelScorer", "add_model_scores"]

logger = logging.getLogger("easyrl.judge")


def add_model_scores(batch: Batch, name: str, scores: Union[torch.Tensor, list[float]], weight: float) -> None:
    """Put ``scores`` ``(bsz,)`` in ``batch`` as ``score/<name>`` and add ``weight x score`` to ``score/overall`` and
    to ``token_level_scores`` ``(bsz, resp_len)`` (on each response's last token), in place."""
    values = scores.float().tolist() if isinstance(scores, torch.Tensor) else [float(s) for s in scores]
    batch["token_level_scores"] = batch["token_level_scores"] + scores_to_token_rewards(
        weight * torch.tensor(values, dtype=torch.float32), batch["response_mask"])
    batch["score/overall"] = [overall + weight * s for overall, s in zip(batch["score/overall"], values)]
    batch[f"score/{name}"] = values


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
        """Judge every sample of ``batch`` and add the scores as ``score/judge`` (raw verdicts in
        ``batch["judge_verdict"]``, the first unreadable one warned of); returns ``{"judge/unparseable": count}``."""
        prompts = self.judge.prompts(self.scorer.reward_inputs(batch))
        requests = Batch(TensorDict({}, batch_size=[len(prompts)]), {"judge_prompt": prompts})
        self.verdicts = [v for share in self.workers.run_split(FSDPWorker.judge, requests) for v in share]
        scores, unparseable = self.judge.scores(self.verdicts)
        add_model_scores(batch, "judge", scores, self.judge.config.weight)
        batch["judge_verdict"] = self.verdicts  # for the generations table (easyrl.trainer.metrics.generation_rows)
        if unparseable:
            first = next(v for v in self.verdicts if self.judge.scores([v])[1])
            logger.warning("judge: %d of %d verdicts unreadable by worker.reward.judge.parser=%s, e.g. %r (None: the "
                           "prompt did not fit max_model_len)", unparseable, len(scores), self.judge.config.parser,
                           first)
        return {"judge/unparseable": float(unparseable)}


class RewardModelScorer:
    """Scores batches with the reward model on the workers; keeps the last templated texts (``last_texts``);
    ``scorer`` decodes the responses."""

    def __init__(self, config: RewardModelConfig, scorer: Scorer, workers: WorkerGroup):
        self.config = config
        self.scorer = scorer
        self.workers = workers
        self.tokenizer = load_tokenizer(config)
        self.chat_template = read_chat_template(config.chat_template)
        self.last_texts: Optional[list[str]] = None

    def conversations(self, batch: Batch) -> tuple[list[str], list[str]]:
        """The prompts (the row's ``prompt`` column, else the policy's prompt decoded) and responses of ``batch``."""
        inputs = self.scorer.reward_inputs(batch)
        prompts = [row["columns"].get("prompt") for row in inputs]
        if any(prompt is None for prompt in prompts):
            decoded = self.scorer.tokenizer.batch_decode(
                [ids[mask.bool()].tolist() for ids, mask in zip(batch["prompts"], batch["prompt_mask"])],
                skip_special_tokens=True)
            prompts = [p if p is not None else d for p, d in zip(prompts, decoded)]
        return [str(p) for p in prompts], [row["response"] for row in inputs]

    def score(self, batch: Batch, metrics: dict[str, float]) -> torch.Tensor:
        """Score ``batch`` (length a multiple of the world size) and add them as ``score/reward_model``; adds
        ``reward_model/truncated`` to ``metrics``. Returns the ``(bsz,)`` scores."""
        prompts, responses = self.conversations(batch)
        encoded = encode_conversations(self.tokenizer, prompts, responses, self.chat_template, self.config.max_length)
        inputs = Batch(TensorDict({"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask},
                                  batch_size=[len(batch)]))
        scores = torch.cat(self.workers.run_split(FSDPWorker.compute_rm_scores, inputs), dim=0)
        add_model_scores(batch, "reward_model", scores, self.config.weight)
        metrics["reward_model/truncated"] = float(encoded.truncated)
        self.last_texts = encoded.texts
        return scores


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
