"""The model reward phases (easyrl/trainer/scoring.py) in training and validation: a batch whose length is not a
multiple of the world size (a validation set's last batch) reaches the workers padded to equal shares, and validation
reports the reward model's score and an ``overall`` with its weighted share, as training does. The worker calls are
stood in by a phase that records what it got (the real ones run in tests/test_e2e_reward_model.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.trainer.scoring import ModelRewards, Scorer, add_model_scores
from easyrl.trainer.validation import Validator

WEIGHT = 0.5


class RecordingRewardModel:
    """A reward-model phase that scores sample i as its first response token / 10 and records the batch sizes."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.sizes: list[int] = []

    def score(self, batch: Batch, metrics: dict) -> torch.Tensor:
        batch.chunk(self.world_size)  # what WorkerGroup.run_split does: raises on unequal shares
        self.sizes.append(len(batch))
        scores = batch["responses"][:, 0].float() / 10
        add_model_scores(batch, "reward_model", scores, WEIGHT)
        return scores


def scored_batch(responses: list[int], rule: list[float]) -> Batch:
    """``len(responses)`` one-token responses with the rule reward's ``rule`` scores set."""
    size = len(responses)
    tensors = TensorDict({"responses": torch.tensor(responses).view(size, 1),
                          "response_mask": torch.ones(size, 1, dtype=torch.long)}, batch_size=[size])
    batch = Batch(tensors, {"uid": [str(i) for i in range(size)]})
    Scorer.set_scores(batch, {"overall": rule, "accuracy": rule})
    return batch


def test_an_uneven_batch_reaches_the_workers_padded_and_comes_back_whole():
    rm = RecordingRewardModel(world_size=2)
    batch = scored_batch([3, 5, 7], [1.0, 0.0, 1.0])
    ModelRewards(None, rm, world_size=2).run(batch, timing := {}, {})
    assert rm.sizes == [4]
    assert batch["score/reward_model"] == pytest.approx([0.3, 0.5, 0.7])
    assert batch["score/overall"] == pytest.approx([1.15, 0.25, 1.35])
    assert batch["token_level_scores"].sum(-1).tolist() == pytest.approx([1.15, 0.25, 1.35])
    assert timing["reward_model"] >= 0


class FakeGenerator:
    """Validation's generator: each prompt id becomes a one-token response equal to it (rule reward: id is odd)."""

    def prompt_batch(self, features, n, step, round_=0, phase="train"):
        return features["prompt_id"]

    def generate_even(self, prompt_ids, overrides):
        return scored_batch(prompt_ids, [0.0] * len(prompt_ids))


class OddScorer:
    def score(self, batch: Batch, step: int, validation: bool = False):
        rule = [float(r % 2) for r in batch["responses"][:, 0].tolist()]
        Scorer.set_scores(batch, {"overall": rule, "accuracy": rule})


def test_validation_reports_the_reward_model_and_its_share_of_overall():
    config = SimpleNamespace(worker=SimpleNamespace(rollout=SimpleNamespace(val_override_config={})),
                             data=SimpleNamespace(val_batch_size=3),
                             trainer=SimpleNamespace(val_generations_to_log=0))
    dataset = [{"prompt_id": i} for i in (1, 2, 3, 4, 6)]  # batches of 3 and 2 over 2 workers
    rm = RecordingRewardModel(world_size=2)
    validator = Validator(config, dataset, FakeGenerator(), OddScorer(), tokenizer=None,
                          model_rewards=ModelRewards(None, rm, world_size=2))
    metrics = validator.run(step=0)
    assert rm.sizes == [4, 2]
    rule, score = [1, 0, 1, 0, 0], [0.1, 0.2, 0.3, 0.4, 0.6]
    assert metrics["val/reward/accuracy"] == pytest.approx(sum(rule) / 5)
    assert metrics["val/reward/reward_model"] == pytest.approx(sum(score) / 5)
    assert metrics["val/reward/overall"] == pytest.approx((sum(rule) + WEIGHT * sum(score)) / 5)


class AgentGenerator(FakeGenerator):
    """Multi-turn trajectories: prompt id ``i`` made ``i`` tool calls, one of which failed when ``i`` is 4."""

    def generate_even(self, prompt_ids, overrides):
        batch = super().generate_even(prompt_ids, overrides)
        batch["multi_turn_stats"] = [
            {"assistant_turns": i + 1, "user_turns": 0, "tool_calls": i, "tool_errors": int(i == 4),
             "tool_timeouts": 0, "tokens": 10, "assistant_tokens": 6} for i in prompt_ids]
        return batch


def test_validation_of_an_agent_reports_its_tool_metrics():
    """``easyrl eval`` of an agent prints the ``val/*`` metrics: its tool calls and errors are among them."""
    config = SimpleNamespace(worker=SimpleNamespace(rollout=SimpleNamespace(val_override_config={})),
                             data=SimpleNamespace(val_batch_size=3),
                             trainer=SimpleNamespace(val_generations_to_log=0))
    metrics = Validator(config, [{"prompt_id": i} for i in (1, 2, 3, 4, 6)], AgentGenerator(), OddScorer(),
                        tokenizer=None).run(step=0)
    assert metrics["val/multi_turn/tool_calls"] == 16.0 and metrics["val/multi_turn/tool_errors"] == 1.0
    assert metrics["val/multi_turn/tool_calls_per_traj/mean"] == pytest.approx(16 / 5)
    assert metrics["val/multi_turn/masked_token_share"] == pytest.approx(0.4)
