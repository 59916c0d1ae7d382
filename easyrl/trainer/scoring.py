"""The trainer's reward phase: decode the responses, score them with the reward function through its guard
(``worker.reward.on_error``, ``timeout_s``), in this process or in the reward actor while the log-prob passes run, and
put the scores in the batch (``token_level_scores`` on the last response token, every named score as ``score/<name>``).

``ScoringMixin`` is a part of :class:`~easyrl.trainer.ray_trainer.RayPPOTrainer`; it uses the trainer's ``config``,
``tokenizer``, ``reward_fn``, ``global_step``, ``_scorer`` and ``_reward_errors``.
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from easyrl.batch import Batch
from easyrl.rewards.function import scores_to_token_rewards
from easyrl.rewards.guard import GuardedReward
from easyrl.rewards.remote import RewardScorer

__all__ = ["ScoringMixin"]


class ScoringMixin:
    """Scoring generated batches (see the module docstring)."""

    def _reward_inputs(self, batch: Batch) -> list[dict[str, Any]]:
        """The reward function's inputs: decoded response, its length in tokens, ground truth."""
        lengths = batch["response_mask"].sum(-1).tolist()
        skip = self.config.worker.reward.skip_special_tokens
        texts = self.tokenizer.batch_decode(
            [row[:n].tolist() for row, n in zip(batch["responses"], lengths)], skip_special_tokens=skip
        )
        return [{"response": text, "response_length": int(n), "ground_truth": gt}
                for text, n, gt in zip(texts, lengths, batch["ground_truth"])]

    @staticmethod
    def _set_scores(batch: Batch, scores: dict[str, list[float]]) -> None:
        """Put ``token_level_scores`` (bsz, resp_len) and each named score (``score/<name>``, a list) in the batch."""
        overall = torch.tensor(scores["overall"], dtype=torch.float32)
        batch["token_level_scores"] = scores_to_token_rewards(overall, batch["response_mask"])
        for name, values in scores.items():
            batch[f"score/{name}"] = values

    def _reward(self, batch: Batch, guard: GuardedReward) -> dict[str, list[float]]:
        """Score every response here and now (see ``_set_scores``) through ``guard`` (``worker.reward.on_error``,
        ``timeout_s``); adds the failed samples to ``_reward_errors``; returns the named scores.

        Raises:
            RewardSampleError: the function failed on a sample and ``on_error`` is ``raise``.
        """
        scores, failures = guard(self._reward_inputs(batch), self.global_step)
        self._reward_errors += len(failures)
        self._set_scores(batch, scores)
        return scores

    def _reward_async(self, batch: Batch) -> ray.ObjectRef:
        """Start scoring ``batch`` with ``self.reward_fn`` in the reward actor; collect with ``_reward_wait``."""
        if self._scorer is None:
            self._scorer = ray.remote(RewardScorer).options(num_cpus=0).remote()
        fn, cfg = self.reward_fn, self.config.worker.reward
        return self._scorer.score_guarded.remote(fn.spec, fn.kwargs, fn.reward_type, self._reward_inputs(batch),
                                                 cfg.on_error, cfg.timeout_s, self.global_step)

    def _reward_wait(self, batch: Batch, pending: ray.ObjectRef, order: list[int]) -> None:
        """Wait for the scores of the batch as generated and set them on ``batch`` (reordered by ``order``)."""
        try:
            scores, failures = ray.get(pending)
        except ray.exceptions.RayTaskError as e:  # the reward function's own error, not Ray's wrapper
            raise e.as_instanceof_cause() from None
        self._reward_errors += len(failures)
        self._set_scores(batch, {name: [values[i] for i in order] for name, values in scores.items()})
