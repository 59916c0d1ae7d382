"""The trainer's reward-model phase (``worker.reward.reward_model``, docs/rewards.md): each (prompt, response) in
the reward model's chat template, scored on the workers and mixed in as ``score/reward_model``:
``overall = rule overall + weight x score/reward_model``."""

from __future__ import annotations

from typing import Optional

import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config import RewardModelConfig
from easyrl.config.reward_model import read_chat_template
from easyrl.rewards.function import scores_to_token_rewards
from easyrl.rewards.reward_model_inputs import encode_conversations, load_tokenizer
from easyrl.trainer.scoring import Scorer
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.group import WorkerGroup

__all__ = ["RewardModelScorer", "mix_reward_model_scores"]

SCORE_NAME = "reward_model"


def mix_reward_model_scores(batch: Batch, scores: torch.Tensor, weight: float) -> None:
    """Put the reward model's ``scores`` ``(bsz,)`` in ``batch`` as ``score/reward_model`` and add ``weight x score``
    to ``token_level_scores`` (on each response's last token) and to ``score/overall``, in place."""
    scores = scores.float()
    batch[f"score/{SCORE_NAME}"] = scores.tolist()
    batch["token_level_scores"] = batch["token_level_scores"] + scores_to_token_rewards(weight * scores,
                                                                                        batch["response_mask"])
    batch["score/overall"] = [rule + weight * s for rule, s in zip(batch["score/overall"], scores.tolist())]


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
        """Score ``batch`` (length a multiple of the world size) and mix the scores in; adds
        ``reward_model/truncated`` to ``metrics``. Returns the ``(bsz,)`` scores."""
        prompts, responses = self.conversations(batch)
        encoded = encode_conversations(self.tokenizer, prompts, responses, self.chat_template, self.config.max_length)
        inputs = Batch(TensorDict({"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask},
                                  batch_size=[len(batch)]))
        scores = torch.cat(self.workers.run_split(FSDPWorker.compute_rm_scores, inputs), dim=0)
        mix_reward_model_scores(batch, scores, self.config.weight)
        metrics["reward_model/truncated"] = float(encoded.truncated)
        self.last_texts = encoded.texts
        return scores
