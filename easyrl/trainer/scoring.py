"""The trainer's reward phase, in training and validation: the guarded reward function scores the decoded responses
(here or in the reward actor while the log-prob passes run) into ``token_level_scores`` (last response token) and
``score/<name>``; then ``ModelRewards`` runs the LLM judge (docs/judge.md) and the reward model (docs/rewards.md),
each adding its named score and its weighted share of ``overall``::

    overall = reward function's overall + judge.weight x score/judge + reward_model.weight x score/reward_model
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional, Union

import ray
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config import RewardModelConfig
from easyrl.config.worker import read_chat_template
from easyrl.rewards.function import RewardFunction, scores_to_token_rewards
from easyrl.rewards.guard import GuardedReward
from easyrl.rewards.judge import Judge, load_judge
from easyrl.rewards.remote import RewardScorer
from easyrl.rewards.reward_model_inputs import encode_conversations, load_tokenizer
from easyrl.trainer.metrics import timer
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.group import WorkerGroup

__all__ = ["JudgePhase", "ModelRewards", "RewardModelScorer", "Scorer", "add_model_scores"]

logger = logging.getLogger("easyrl.judge")


class Scorer:
    """Scores generated batches; owns the reward functions (``config``: ``worker.reward``; ``val_reward_fn`` None:
    ``reward_fn``), their guards and the reward actor. Each scoring returns the number of failed samples."""

    def __init__(self, config, tokenizer, reward_fn, val_reward_fn=None):
        self.config = config
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.guard = GuardedReward(reward_fn, config.on_error, config.timeout_s)
        self.val_guard = self.guard if val_reward_fn is None or val_reward_fn is reward_fn else GuardedReward(
            val_reward_fn, config.on_error, config.timeout_s)
        self._remote: Optional[ray.actor.ActorHandle] = None  # the reward actor, started on first use
        self._lock = threading.Lock()  # split placement: chunks score from threads of their own, one at a time

    @property
    def can_score_async(self) -> bool:
        """Whether the training reward can run in the reward actor (a ``RewardFunction`` is shipped by its spec; a
        plain callable is not)."""
        return isinstance(self.reward_fn, RewardFunction)

    def reward_inputs(self, batch: Batch) -> list[dict[str, Any]]:
        """The reward inputs: decoded response, its length in tokens, ground truth, the row's ``columns`` (and a
        multi-turn rollout's ``messages`` and ``tool_calls``, an agent rollout's ``agent_result``)."""
        lengths = batch["response_mask"].sum(-1).tolist()
        # every token after the prompt (a multi-turn response holds tool turns, outside response_mask)
        ends = batch["attention_mask"][:, -batch["responses"].shape[1]:].sum(-1).tolist()
        texts = self.tokenizer.batch_decode(
            [row[:n].tolist() for row, n in zip(batch["responses"], ends)],
            skip_special_tokens=self.config.skip_special_tokens,
        )
        columns = batch["columns"] if "columns" in batch else [{}] * len(texts)
        inputs = [{"response": text, "response_length": int(n), "ground_truth": gt, "columns": row}
                  for text, n, gt, row in zip(texts, lengths, batch["ground_truth"], columns)]
        for key in ("messages", "tool_calls", "agent_result"):  # multi-turn and agent rollouts (docs/agents.md)
            if key in batch:
                for reward_input, value in zip(inputs, batch[key]):
                    reward_input[key] = value
        return inputs

    @staticmethod
    def set_scores(batch: Batch, scores: dict[str, list[float]]) -> None:
        """Put ``token_level_scores`` (bsz, resp_len) and each named score (``score/<name>``, a list) in the batch."""
        overall = torch.tensor(scores["overall"], dtype=torch.float32)
        batch["token_level_scores"] = scores_to_token_rewards(overall, batch["response_mask"])
        for name, values in scores.items():
            batch[f"score/{name}"] = values

    def score(self, batch: Batch, step: int, validation: bool = False) -> tuple[dict[str, list[float]], int]:
        """Score every response here and now (see :meth:`set_scores`) through the training (or validation) guard;
        returns the named scores and the number of samples the function failed on. Raises ``RewardSampleError``
        when it failed on a sample and ``on_error`` is ``raise``."""
        guard = self.val_guard if validation else self.guard
        with self._lock:
            scores, failures = guard(self.reward_inputs(batch), step)
        self.set_scores(batch, scores)
        return scores, len(failures)

    def score_async(self, batch: Batch, step: int) -> ray.ObjectRef:
        """Start scoring ``batch`` with the training reward in the reward actor; collect with :meth:`wait`."""
        if self._remote is None:
            self._remote = ray.remote(RewardScorer).options(num_cpus=0).remote()
        fn, cfg = self.reward_fn, self.config
        return self._remote.score_guarded.remote(fn.spec, fn.kwargs, fn.reward_type, self.reward_inputs(batch),
                                                 cfg.on_error, cfg.timeout_s, step)

    def wait(self, batch: Batch, pending: ray.ObjectRef, order: list[int]) -> int:
        """Wait for the scores of the batch as generated and set them on ``batch`` (reordered by ``order``); returns
        the number of samples the function failed on."""
        try:
            scores, failures = ray.get(pending)
        except ray.exceptions.RayTaskError as e:  # the reward function's own error, not Ray's wrapper
            raise e.as_instanceof_cause() from None
        self.set_scores(batch, {name: [values[i] for i in order] for name, values in scores.items()})
        return len(failures)

    def close(self) -> None:
        """Stop the guards' helper processes."""
        self.guard.close()
        if self.val_guard is not self.guard:
            self.val_guard.close()


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
        """The phases ``config.worker.reward`` asks for, calling ``workers``; none in a replay (no engines: the
        dumped scores hold the judge's and reward model's already). ``ConfigError`` for a bad judge prompt template or
        parser."""
        if not config.placement.engines:
            return cls(None, None, workers.world_size)
        reward = config.worker.reward
        judge = load_judge(reward.judge)  # None while worker.reward.judge.model_path is null
        judging = JudgePhase(judge, scorer, workers) if judge is not None else None
        reward_model = RewardModelScorer(reward.reward_model, scorer, workers) if reward.reward_model.enabled else None
        return cls(judging, reward_model, workers.world_size)

    def run(self, batch: Batch, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """Score ``batch`` with the judge, then the reward model, in place, timed into ``timing``; a batch not a
        multiple of ``world_size`` is padded with copies, dropped again."""
        if self.judging is None and self.reward_model is None:
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
