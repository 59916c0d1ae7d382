"""The trainer's reward phase: score decoded responses with the guarded reward function, here or in the reward actor
while the log-prob passes run, into ``token_level_scores`` (last response token) and ``score/<name>``."""

from __future__ import annotations

from typing import Any, Optional

import ray
import torch

from easyrl.batch import Batch
from easyrl.rewards.function import RewardFunction, scores_to_token_rewards
from easyrl.rewards.guard import GuardedReward
from easyrl.rewards.remote import RewardScorer

__all__ = ["Scorer"]


class Scorer:
    """Scores generated batches; owns the reward functions (``config``: ``worker.reward``; ``val_reward_fn`` None:
    ``reward_fn``), their guards and the reward actor. Each scoring returns the number of failed samples."""

    def __init__(self, config, tokenizer, reward_fn, val_reward_fn=None):
        self.config = config
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.guard = GuardedReward(reward_fn, config.on_error, config.timeout_s)
        if val_reward_fn is None or val_reward_fn is reward_fn:
            self.val_guard = self.guard
        else:
            self.val_guard = GuardedReward(val_reward_fn, config.on_error, config.timeout_s)
        self._remote: Optional[ray.actor.ActorHandle] = None  # the reward actor, started on first use

    @property
    def can_score_async(self) -> bool:
        """Whether the training reward can run in the reward actor (a ``RewardFunction`` is shipped by its spec; a
        plain callable is not)."""
        return isinstance(self.reward_fn, RewardFunction)

    def reward_inputs(self, batch: Batch) -> list[dict[str, Any]]:
        """The reward inputs: decoded response, its length in tokens, ground truth, the row's ``columns`` (and a
        multi-turn rollout's ``messages`` and ``tool_calls``)."""
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
        for key in ("messages", "tool_calls"):  # multi-turn rollouts (easyrl.trainer.multi_turn, docs/agents.md)
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
        returns the named scores and the number of samples the function failed on.

        Raises:
            RewardSampleError: the function failed on a sample and ``on_error`` is ``raise``.
        """
        guard = self.val_guard if validation else self.guard
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
