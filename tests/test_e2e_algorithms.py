"""Every advantage estimator, policy loss and aggregation mode, and DAPO dynamic sampling, through the real loop:
2 Ray workers (FSDP2 over gloo + vLLM each) and the tiny text Qwen2.5. One trainer serves all cases (start-up is
the expensive part on a CPU); the estimator is the trainer's setting, the loss settings are pushed to the workers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
ESTIMATORS = ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "grpo_passk"]
LOSSES = [("vanilla", "token-mean"), ("gspo", "seq-mean-token-mean"), ("cispo", "seq-mean-token-sum"),
          ("vanilla", "seq-mean-token-sum-norm"), ("sapo", "seq-mean-token-mean")]


@pytest.fixture(scope="module")
def trainer(e2e_config, tmp_path_factory):
    import ray

    from easyrl.trainer.__main__ import build_trainer

    config = e2e_config(
        "qwen2_5", tmp_path_factory.mktemp("runs"),
        "data.val_files=null",
        "data.max_response_length=16",
        "worker.rollout.limit_images=0",
    )
    ray.init(num_cpus=2, include_dashboard=False)
    trainer = build_trainer(config)
    yield trainer
    trainer.workers.shutdown()
    ray.shutdown()


def _steps(trainer, count=2):
    stream = trainer.prompt_stream()
    return [trainer.train_step(stream) for _ in range(count)]


def _assert_finite(metrics):
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    assert not bad, bad


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_each_advantage_estimator_two_steps(trainer, estimator):
    trainer.config.algorithm.adv_estimator = estimator
    for metrics in _steps(trainer):
        _assert_finite(metrics)
        assert metrics["critic/advantages/max"] > metrics["critic/advantages/min"]
    if estimator == "remax":
        assert "timing_s/gen_baseline" in metrics
        assert "reward_baselines" in trainer.last_batch
    trainer.config.algorithm.adv_estimator = "grpo"


@pytest.mark.parametrize("loss_type, agg_mode", LOSSES)
def test_each_policy_loss_two_steps(trainer, loss_type, agg_mode):
    actor = trainer.config.worker.actor
    original = dataclasses.replace(actor)
    actor.loss_type, actor.loss_agg_mode = loss_type, agg_mode
    if loss_type == "gspo":
        actor.clip_ratio_low, actor.clip_ratio_high = 3e-4, 4e-4
    trainer.workers.run_all("update_config", trainer.config)
    try:
        for metrics in _steps(trainer):
            _assert_finite(metrics)
            assert metrics["actor/pg_loss"] != 0.0
    finally:
        trainer.config.worker.actor = original
        trainer.workers.run_all("update_config", trainer.config)


def test_kl_in_reward_and_entropy_bonus(trainer):
    algo, actor = trainer.config.algorithm, trainer.config.worker.actor
    algo.use_kl_loss, algo.use_kl_in_reward, algo.kl_type = False, True, "adaptive"
    actor.use_kl_loss, actor.entropy_coeff = False, 1e-3
    trainer.workers.run_all("update_config", trainer.config)
    try:
        metrics = _steps(trainer, 1)[0]
        _assert_finite(metrics)
        assert "actor/reward_kl_penalty" in metrics and "actor/kl_loss" not in metrics
    finally:
        algo.use_kl_loss, algo.use_kl_in_reward, algo.kl_type = True, False, "fixed"
        actor.use_kl_loss, actor.entropy_coeff = True, 0.0
        trainer.workers.run_all("update_config", trainer.config)


def test_disable_kl_skips_the_reference_forward(trainer):
    algo = trainer.config.algorithm
    algo.disable_kl = True
    trainer.config.worker.actor.disable_kl = True
    trainer.workers.run_all("update_config", trainer.config)
    try:
        metrics = _steps(trainer, 1)[0]
    finally:
        algo.disable_kl = False
        trainer.config.worker.actor.disable_kl = False
        trainer.workers.run_all("update_config", trainer.config)
    _assert_finite(metrics)
    assert "timing_s/ref" not in metrics and "actor/kl_loss" not in metrics
    assert "ref_log_probs" not in trainer.last_batch


def test_truncated_importance_sampling_with_rollout_log_probs(trainer):
    """vLLM's sampled-token log-probs travel with the batch; TIS weights exp(old - rollout), capped, are ~1 when
    the engine holds exactly the actor's weights (the mismatch is only kernel noise)."""
    rollout, actor = trainer.config.worker.rollout, trainer.config.worker.actor
    rollout.calculate_log_probs, actor.tis_cap = True, 2.0
    trainer.workers.run_all("update_config", trainer.config)
    try:
        metrics = _steps(trainer, 1)[0]
    finally:
        rollout.calculate_log_probs, actor.tis_cap = False, None
        trainer.workers.run_all("update_config", trainer.config)
    _assert_finite(metrics)
    assert metrics["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=1e-2)
    assert metrics["rollout/log_prob_diff_max"] < 2e-3
    assert "rollout_log_probs" in trainer.last_batch


def test_dynamic_sampling_drops_constant_groups_and_refills(trainer):
    """Half of the problems get a constant reward: their groups are dropped and more prompts are generated until
    the batch holds rollout_batch_size groups that all vary."""
    from easyrl.rewards.function import RewardFunction
    from easyrl.rewards.guard import GuardedReward

    algo = trainer.config.algorithm
    saved_guard = trainer._guard  # the trainer scores through its guard (worker.reward.on_error, timeout_s)
    half_constant = RewardFunction(f"{REPO / 'tests/reward_functions/half_constant.py'}:compute_score")
    generated: list[float] = []

    def recording_reward(inputs):  # the real reward function; records every generated sample's score
        scores = half_constant(inputs)
        generated.extend(scores["overall"])
        return scores

    # a plain callable cannot run in the guard's helper process: a guard of its own, scoring in-process
    trainer._guard = GuardedReward(recording_reward, on_error="raise")
    algo.online_filtering, algo.filter_low, algo.filter_high = True, None, None
    try:
        metrics = _steps(trainer, 1)[0]
    finally:
        trainer._guard = saved_guard
        algo.online_filtering, algo.filter_low, algo.filter_high = False, 0.01, 0.99
    batch = trainer.last_batch
    n, groups = trainer.config.worker.rollout.n, trainer.config.data.rollout_batch_size
    assert len(batch) == n * groups
    assert metrics["dynamic_sampling/groups_dropped"] >= 1
    assert metrics["dynamic_sampling/num_gen_batches"] >= 2
    scores = np.array(batch["score/overall"]).reshape(groups, n)
    assert (scores.max(axis=1) > scores.min(axis=1)).all()  # every kept group varies
    assert len(set(batch["uid"])) == groups
    # reward/* is over every generated sample (dropped groups included, as EasyR1), not only the kept batch
    assert len(generated) > len(batch)
    assert metrics["reward/overall"] == pytest.approx(np.mean(generated))
    assert metrics["reward/overall"] != pytest.approx(np.mean(batch["score/overall"]))
