"""On-policy distillation's parts without Ray: the advantage math (``easyrl.algorithms.distillation``), the trainer's
mixing step, the config properties, the teacher's memory and role settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from easyrl.algorithms.advantages import AdvantageInputs, compute_advantage
from easyrl.algorithms.distillation import (
    add_distillation,
    on_policy_distill_advantage,
    reverse_kl_metrics,
    token_reverse_kl,
)
from easyrl.config import load_config

CONFIG = f"config={Path(__file__).resolve().parents[1] / 'config.yaml'}"

# two samples, three response positions; the second sample's last position is padding
STUDENT = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -7.0]])
TEACHER = torch.tensor([[-2.0, -1.0, -0.5], [-1.0, -0.6, -1.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _config(*overrides):
    return load_config([CONFIG, "worker.actor.model.model_path=m", *overrides])


def test_token_reverse_kl_is_student_minus_teacher_on_response_tokens_only():
    kl = token_reverse_kl(STUDENT, TEACHER, MASK)
    # by hand: log pi_student - log pi_teacher; the padded position is 0 whatever its log-probs
    assert torch.equal(kl, torch.tensor([[1.0, -1.0, 0.0], [-2.0, 0.5, 0.0]]))
    # mean over the 5 response tokens: (1 - 1 + 0 - 2 + 0.5) / 5
    assert reverse_kl_metrics(kl, MASK) == {"distill/reverse_kl": pytest.approx(-1.5 / 5)}


def test_token_reverse_kl_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="bsz, resp_len"):
        token_reverse_kl(STUDENT, TEACHER[:, :2], MASK)


def test_pure_distillation_advantage_is_the_negative_reverse_kl_with_discount_zero():
    inputs = AdvantageInputs(torch.zeros(2, 3), MASK, np.array(["a", "a"]), old_log_probs=STUDENT,
                             teacher_log_probs=TEACHER)
    advantages, returns = compute_advantage("on_policy_distill", inputs)
    # each token judged alone (no return over later tokens): a token the teacher likes more than the student gets a
    # positive advantage, one the student overrates a negative one
    expected = torch.tensor([[-1.0, 1.0, 0.0], [2.0, -0.5, 0.0]])
    assert torch.equal(advantages, expected) and torch.equal(returns, expected)
    # rewards are not used
    rewarded = AdvantageInputs(torch.full((2, 3), 5.0), MASK, np.array(["a", "b"]), old_log_probs=STUDENT,
                               teacher_log_probs=TEACHER)
    assert torch.equal(on_policy_distill_advantage(rewarded)[0], expected)


def test_pure_distillation_needs_both_log_probs():
    with pytest.raises(ValueError, match="teacher_log_probs"):
        on_policy_distill_advantage(AdvantageInputs(torch.zeros(2, 3), MASK, np.array(["a", "a"]),
                                                    old_log_probs=STUDENT))


def test_mixed_advantage_subtracts_coef_times_reverse_kl():
    rl = torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]])
    mixed = add_distillation(rl, token_reverse_kl(STUDENT, TEACHER, MASK), 0.1)
    assert torch.allclose(mixed, torch.tensor([[0.4, 0.6, 0.5], [-0.3, -0.55, 0.0]]))


def test_trainer_mixes_the_reverse_kl_into_grpo_advantages_and_reports_it():
    from easyrl.batch import Batch
    from easyrl.trainer.ray_trainer import RayPPOTrainer

    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # the advantage phase alone: no workers, datasets or reward
    trainer.config = _config("algorithm.distill_coef=0.5", "worker.teacher.model.model_path=t")
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    batch = Batch({"token_level_rewards": scores, "response_mask": MASK, "old_log_probs": STUDENT,
                   "teacher_log_probs": TEACHER}, {"uid": ["a", "a"]})
    trainer._compute_advantage(batch)
    grpo = batch["advantages"].clone()
    metrics = trainer._distill(batch)
    assert torch.allclose(batch["advantages"], grpo - 0.5 * token_reverse_kl(STUDENT, TEACHER, MASK))
    assert metrics["distill/reverse_kl"] == pytest.approx(-0.3)


def test_needs_teacher_and_the_old_log_prob_pass():
    plain = _config()
    assert not plain.algorithm.needs_teacher and plain.on_policy_update is not None
    mixed = _config("algorithm.distill_coef=0.1", "worker.teacher.model.model_path=t",
                    "data.rollout_batch_size=128", "worker.actor.global_batch_size=128")
    pure = _config("algorithm.adv_estimator=on_policy_distill", "worker.teacher.model.model_path=t",
                   "data.rollout_batch_size=128", "worker.actor.global_batch_size=128")
    for config in (mixed, pure):
        # the reverse KL needs the student's log-probs before the update: never the on-policy shortcut
        assert config.algorithm.needs_teacher and not config.on_policy_update
    assert mixed.worker.teacher.micro_batch_size_per_device_for_experience == \
        mixed.worker.actor.micro_batch_size_per_device_for_experience


def test_teacher_memory_is_its_shard_in_the_compute_dtype_unless_offloaded():
    from easyrl.sizing.anatomy import GIB
    from easyrl.sizing.estimate import estimate_memory

    on_device = _config("algorithm.distill_coef=0.1", "worker.teacher.model.model_path=t",
                        "worker.teacher.offload.offload_params=false")
    estimate = estimate_memory(1_700_000_000, 151_936, on_device, 80.0, teacher_params=8_000_000_000)
    teacher = 2 * 8e9 / on_device.world_size / GIB  # bf16 shard of an 8B teacher over 8 devices
    assert estimate.rollout["teacher"] == pytest.approx(teacher)
    assert estimate.training["teacher"] == pytest.approx(teacher)
    offloaded = _config("algorithm.distill_coef=0.1", "worker.teacher.model.model_path=t")
    assert estimate_memory(1_700_000_000, 151_936, offloaded, 80.0, teacher_params=8_000_000_000).training[
        "teacher"] == 0.0
    assert "teacher" not in estimate_memory(1_700_000_000, 151_936, _config(), 80.0).training


def test_teacher_role_takes_the_actors_sharding_and_its_own_trust_remote_code():
    from easyrl.workers.roles import teacher_role_config

    config = _config("algorithm.distill_coef=0.1", "worker.teacher.model.model_path=t",
                     "worker.teacher.model.trust_remote_code=true", "worker.actor.model.lora.rank=8")
    role = teacher_role_config(config)
    assert role.fsdp == config.worker.actor.fsdp and role.padding_free == config.worker.actor.padding_free
    assert role.model.trust_remote_code and not config.worker.actor.model.trust_remote_code  # a copy


def test_pure_distillation_does_not_warn_of_constant_rewards(caplog):
    from easyrl.batch import Batch
    from easyrl.trainer.ray_trainer import RayPPOTrainer

    batch = Batch({"token_level_scores": torch.zeros(2, 3)}, {"uid": ["a", "a"]})
    for estimator, warns in (("on_policy_distill", False), ("grpo", True)):
        trainer = RayPPOTrainer.__new__(RayPPOTrainer)
        trainer.config = _config(f"algorithm.adv_estimator={estimator}", "worker.teacher.model.model_path=t")
        trainer.global_step, trainer._last_frac_zero_std = 1, None
        caplog.clear()
        assert trainer._check_reward_variance(batch) == 1.0
        # the reward is not in a pure distillation's advantage: "all advantages are 0" would be false
        assert ("all advantages are 0" in caplog.text) == warns
