"""Every advantage estimator (GAE with a critic included), policy loss and aggregation mode, and DAPO dynamic sampling,
through the real loop: 2 Ray workers (FSDP2 over gloo + vLLM each) and the tiny text Qwen2.5. One trainer serves all
cases (start-up is the expensive part on a CPU): it is built with GAE so that the workers hold a critic too; the
estimator is the trainer's setting, the loss settings are pushed to the workers. A step costs seconds, so an estimator
is checked on a step that another test takes anyway where that test's assertions do not depend on it
(``HOSTED_ESTIMATORS``); the others take a step of their own.

Each setting is checked by an assertion that fails if a worker ignored it: the actor updates are replayed from one
snapshot (same weights, optimizer state and mini-batch shuffle) on one batch, so that settings are compared update
against update."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from easyrl.testing.worker import InspectableWorker
from easyrl.workers.fsdp_worker import FSDPWorker

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
# fp32 vLLM (CPU) vs the fp32 FSDP2 actor: max |diff| of per-token log-probs measured 1.9e-6 (tests/test_e2e_grpo.py)
FP32_LOGPROB_TOL = 1e-4
ESTIMATORS = ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "grpo_passk", "opo",
              "gpg", "gdpo"]
# "gae" (needs the critic) has its own test below; these run the step of the test named (_check_estimator_step)
HOSTED_ESTIMATORS = {"grpo": "replay", "reinforce_plus_plus": "kl_in_reward_steps (step 1)",
                     "reinforce_plus_plus_baseline": "kl_in_reward_steps (step 2)",
                     "gpg": "test_disable_kl_skips_the_reference_forward",
                     "rloo": "test_truncated_importance_sampling_at_temperature_0_7",
                     "opo": "test_dynamic_sampling_drops_constant_groups_and_refills"}
OWN_STEP_ESTIMATORS = [e for e in ESTIMATORS if e not in HOSTED_ESTIMATORS]  # remax, grpo_passk, gdpo
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
             "seq-mean-token-sum-norm-drgrpo"]
# the first four agree on policy; the others change even the first (on-policy) mini-batch's update (clip_cov/kl_cov
# act on high-covariance tokens, geo_mean averages per sequence, bypass_mode's ratio is against vLLM's log-probs)
LOSS_TYPES = ["vanilla", "gspo", "cispo", "sapo"]
NEW_LOSS_SETTINGS = {  # verl 0.9's losses (#24), with settings that make each visibly act on this small batch; dppo_kl,
    # dro and gpg, which agree on policy as dppo_tv does, are pinned to verl's numbers by tests/test_verl_parity.py
    "clip_cov": dict(clip_cov_ratio=0.2, clip_cov_lb=-10.0, clip_cov_ub=10.0),
    "kl_cov": dict(kl_cov_ratio=0.2, ppo_kl_coef=1.0),
    "geo_mean": {}, "dppo_tv": {},
    "bypass_mode": dict(bypass_loss_type="reinforce", rollout_is="token", rollout_is_threshold=1.01),
}


@pytest.fixture(scope="module")
def trainer(e2e_config, local_ray, tmp_path_factory):
    from easyrl.trainer.__main__ import build_trainer

    config = e2e_config(
        "qwen2_5", tmp_path_factory.mktemp("runs"),
        "data.val_files=null",
        "data.max_response_length=16",
        "worker.rollout.limit_images=0",
        "algorithm.adv_estimator=gae",  # builds the critic; the tests below choose their estimator per step
        "worker.critic.global_batch_size=2",
        "worker.critic.micro_batch_size_per_device_for_update=2",
        "worker.critic.fsdp.param_dtype=fp32",
        "worker.critic.fsdp.enable_gradient_checkpointing=false",
        "worker.critic.optim.lr=1e-2",  # large, so that one step visibly moves the zero-initialised value head
        "worker.critic.optim.lr_warmup_ratio=1.0",  # linear warm-up over the 2 training steps: the LR logging is seen
    )
    local_ray()
    trainer = build_trainer(config, worker_cls=InspectableWorker)
    trainer.config.algorithm.adv_estimator = "grpo"
    yield trainer
    trainer.close()


def _steps(trainer, count=2, estimator="grpo"):
    """``count`` steps with ``estimator`` (then back to grpo); their metrics."""
    stream = trainer.prompt_stream()
    trainer.config.algorithm.adv_estimator = estimator
    try:
        return [trainer.train_step(stream) for _ in range(count)]
    finally:
        trainer.config.algorithm.adv_estimator = "grpo"


def _assert_finite(metrics):
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    assert not bad, bad


def _check_estimator_step(metrics, batch, estimator):
    """A step with ``estimator`` (not GAE) trained on advantages that vary and ran no critic."""
    _assert_finite(metrics)
    assert metrics["critic/advantages/max"] > metrics["critic/advantages/min"], estimator
    assert "critic/vf_loss" not in metrics and "timing_s/values" not in metrics  # no critic without GAE
    if estimator == "remax":
        assert "timing_s/gen_baseline" in metrics
        assert "reward_baselines" in batch


@pytest.mark.parametrize("estimator", OWN_STEP_ESTIMATORS)
def test_each_advantage_estimator_one_step(trainer, estimator):
    _check_estimator_step(_steps(trainer, 1, estimator)[0], trainer.last_batch, estimator)


def _zero_value_returns(batch, decay):
    """GAE returns when every value is 0 and the score sits on the last token: ``decay^(n - 1 - t) * R``."""
    import torch

    mask = batch["response_mask"].float()
    lengths = mask.sum(-1, keepdim=True)
    steps_to_end = lengths - 1 - torch.arange(mask.shape[1]).unsqueeze(0)
    return batch["token_level_rewards"].sum(-1, keepdim=True) * decay ** steps_to_end.clamp(min=0) * mask


@pytest.fixture(scope="module")
def critic_run(trainer):
    """PPO with GAE for two steps: step 1 is the critic's warm-up (``critic_warmup: 2``: the actor updates from step 2
    on, as in verl/EasyR1), step 2 updates both; then the critic's state goes through a checkpoint (saved, moved by
    one more update, loaded). Returns what the tests below look at."""
    import torch

    algo, tcfg = trainer.config.algorithm, trainer.config.trainer
    algo.adv_estimator, algo.gamma, algo.lam, tcfg.critic_warmup = "gae", 1.0, 0.9, 2
    stream = trainer.prompt_stream()
    run = {"weights_before": trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]}
    try:
        trainer.global_step = 1
        run["warm"], run["warm_batch"] = trainer.train_step(stream), trainer.last_batch
        run["weights_after"] = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
        trainer.global_step = 2
        run["second"], run["batch"] = trainer.train_step(stream), trainer.last_batch
        run["path"] = path = trainer.save_checkpoint()
        run["saved"] = torch.cat(trainer.workers.run_split(FSDPWorker.compute_values, run["batch"]), dim=0)
        trainer.workers.run_split(FSDPWorker.update_critic, run["batch"])  # moves the critic away from the checkpoint
        run["moved"] = torch.cat(trainer.workers.run_split(FSDPWorker.compute_values, run["batch"]), dim=0)
        trainer.load_checkpoint(path)
        run["restored"] = torch.cat(trainer.workers.run_split(FSDPWorker.compute_values, run["batch"]), dim=0)
    finally:
        algo.adv_estimator, algo.gamma, algo.lam, tcfg.critic_warmup = "grpo", 1.0, 1.0, 0
        trainer.global_step = 0
    return run


def test_critic_warmup_step_trains_only_the_critic(critic_run):
    """Step 1: only the critic trained; the zero value head predicts 0 everywhere, so GAE's return on token t of a
    response of n tokens with outcome score R is (gamma * lam)^(n - 1 - t) * R (every TD error but the last is 0)."""
    import torch

    warm, batch = critic_run["warm"], critic_run["warm_batch"]
    _assert_finite(warm)
    assert warm["critic/vf_loss"] > 0 and 0.0 <= warm["critic/vf_clipfrac"] <= 1.0
    assert "timing_s/values" in warm and "timing_s/update_critic" in warm
    assert "actor/pg_loss" not in warm and "timing_s/update_actor" not in warm
    before, after = critic_run["weights_before"], critic_run["weights_after"]
    assert all(torch.equal(before[k], after[k]) for k in before)
    # the critic's first update ran at the first warm-up LR of the schedule (lr_warmup_ratio 1 over 2 steps: half)
    assert warm["critic/lr"] == pytest.approx(0.5 * 1e-2)
    assert warm["critic/values/max"] == warm["critic/values/min"] == 0.0
    torch.testing.assert_close(batch["returns"], _zero_value_returns(batch, 0.9))


def test_critic_values_shape_the_returns_after_warmup(critic_run):
    """Step 2: the critic moved, its values shape the returns (GAE), the actor trains; advantages are whitened."""
    second, batch = critic_run["second"], critic_run["batch"]
    _assert_finite(second)
    assert second["critic/vf_loss"] > 0 and "timing_s/update_critic" in second
    assert second["critic/values/max"] > second["critic/values/min"]
    assert "actor/pg_loss" in second and second["critic/lr"] == pytest.approx(1e-2)
    assert (batch["returns"] - _zero_value_returns(batch, 0.9)).abs().max() > 1e-3
    advantages = batch["advantages"][batch["response_mask"].bool()]
    assert abs(advantages.mean().item()) < 1e-4  # GAE advantages are whitened over the batch's valid tokens
    assert advantages.std().item() == pytest.approx(1.0, abs=1e-3)


def test_critic_state_goes_through_a_checkpoint(critic_run):
    """The checkpoint holds the critic: loading it undoes the update made after saving."""
    import os

    import torch

    assert os.path.exists(os.path.join(critic_run["path"], "critic", ".metadata"))
    assert (critic_run["moved"] - critic_run["saved"]).abs().max() > 1e-4
    torch.testing.assert_close(critic_run["restored"], critic_run["saved"])


TIGHT = dict(clip_ratio_low=0.02, clip_ratio_high=0.02)  # so that the off-policy mini-batch clips some tokens


@pytest.fixture(scope="module")
def replay(trainer):
    """One step, then a snapshot of the actor and that step's batch with its old log-probs recomputed from the
    snapshot's weights: every update below (``_update``) starts from the same weights, optimizer state and
    mini-batch shuffle and uses the same batch (2 mini-batches of 8 samples, 4 per worker), so that settings are
    compared update against update. Returns ``(batch, start weights, the step's metrics)``."""
    import torch

    from easyrl.trainer.rollout import for_workers

    metrics = _steps(trainer, 1)[0]
    batch = for_workers(trainer.last_batch)
    batch["old_log_probs"] = torch.cat(trainer.workers.run_split(FSDPWorker.compute_log_probs, batch), dim=0)
    trainer.workers.run_all(InspectableWorker.snapshot_actor)
    return batch, trainer.workers.run_all(InspectableWorker.actor_state_dict)[0], metrics


def test_the_replayed_step_is_a_grpo_step(replay):
    batch, _, metrics = replay
    _check_estimator_step(metrics, batch, "grpo")


def _update(trainer, batch, **actor_settings):
    """From the snapshot, one actor update of ``batch`` with ``actor_settings``; returns rank 0's per-optimizer-step
    metrics (lists: one value per mini-batch and epoch)."""
    actor = trainer.config.worker.actor
    original = dataclasses.replace(actor)
    for key, value in actor_settings.items():
        setattr(actor, key, value)
    trainer.workers.run_all(InspectableWorker.restore_actor)
    trainer.workers.run_all(InspectableWorker.update_config, trainer.config)
    try:
        return trainer.workers.run_split(FSDPWorker.update_actor, batch)[0]
    finally:
        trainer.config.worker.actor = original
        trainer.workers.run_all(InspectableWorker.update_config, trainer.config)


def _max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def loss_type_runs(trainer, replay):
    """The update of every loss type from the snapshot (rank 0's per-mini-batch metrics)."""
    batch, *_ = replay
    runs = {loss: _update(trainer, batch, loss_type=loss, **TIGHT) for loss in LOSS_TYPES}
    # bypass_mode takes vLLM's log-probs as the old ones: here the recomputed old log-probs stand for them
    bypass_batch = batch.select(list(range(len(batch))))
    bypass_batch["rollout_log_probs"] = batch["old_log_probs"]
    for loss, settings in NEW_LOSS_SETTINGS.items():
        runs[loss] = _update(trainer, bypass_batch if loss == "bypass_mode" else batch, loss_type=loss,
                             **{**TIGHT, **settings})
    return runs


def test_loss_types_agree_on_policy(loss_type_runs):
    """On-policy invariant: the first mini-batch sees r = 1, so nothing is clipped, ppo_kl ~ 0, and every loss type's
    gradient is the plain policy gradient (same norm)."""
    first = {loss: run["actor/grad_norm"][0] for loss, run in loss_type_runs.items()
             if loss in LOSS_TYPES + ["dppo_tv"]}
    for loss in first:
        assert first[loss] == pytest.approx(first["vanilla"], rel=1e-5), (loss, first)
    for loss in first:
        run = loss_type_runs[loss]
        assert abs(run["actor/ppo_kl"][0]) < 1e-4 and run["actor/pg_clipfrac"][0] == 0.0


def test_loss_types_differ_off_policy(loss_type_runs):
    """The second mini-batch is off policy (the first one's step moved the weights): each loss gives its own update."""
    second = {loss: run["actor/grad_norm"][1] for loss, run in loss_type_runs.items()}
    assert len({round(second[loss], 6) for loss in LOSS_TYPES}) == len(LOSS_TYPES), second
    for loss in NEW_LOSS_SETTINGS:  # each of verl 0.9's losses changes the update
        _assert_finite({f"{loss}/{i}": v for i, v in enumerate(loss_type_runs[loss]["actor/grad_norm"])})
        assert second[loss] != pytest.approx(second["vanilla"], rel=1e-6), (loss, second)


def test_aggregation_modes_scale_the_update_as_defined(trainer, replay, loss_type_runs):
    batch, *_ = replay
    # token-mean with TIGHT is the vanilla loss type's update (the defaults): not repeated
    runs = {agg: loss_type_runs["vanilla"] if agg == "token-mean" else
            _update(trainer, batch, loss_agg_mode=agg, **TIGHT) for agg in AGG_MODES}
    norm = {agg: run["actor/grad_norm"][0] for agg, run in runs.items()}  # first mini-batch, before clipping
    # seq-mean-token-sum-norm is Dr. GRPO's mean (verl 0.7.1-0.9.1); token-sum is S = 8 sequences times
    # seq-mean-token-sum
    assert norm["seq-mean-token-sum-norm"] == pytest.approx(norm["seq-mean-token-sum-norm-drgrpo"], rel=1e-6)
    assert norm["token-sum"] == pytest.approx(8 * norm["seq-mean-token-sum"], rel=1e-5)
    # with responses of equal length n (the tiny random model rarely stops before the maximum) seq-mean-token-sum is
    # n x token-mean and seq-mean-token-mean equals it; otherwise they differ
    lengths = batch["response_mask"].sum(-1)
    if bool((lengths == lengths[0]).all()):
        assert norm["seq-mean-token-sum"] == pytest.approx(lengths[0].item() * norm["token-mean"], rel=1e-5)
        assert norm["seq-mean-token-mean"] == pytest.approx(norm["token-mean"], rel=1e-5)
        assert norm["seq-mean-token-sum-norm-drgrpo"] == pytest.approx(
            lengths[0].item() / batch["response_mask"].shape[1] * norm["token-mean"], rel=1e-5)
    else:
        assert norm["seq-mean-token-sum"] != pytest.approx(norm["token-mean"], rel=1e-3)


def test_entropy_bonus_enters_the_update(trainer, replay, loss_type_runs):
    batch, *_ = replay
    base = loss_type_runs["vanilla"]  # the defaults with TIGHT
    entropy = _update(trainer, batch, entropy_coeff=0.1, **TIGHT)
    assert entropy["actor/grad_norm"][0] != pytest.approx(base["actor/grad_norm"][0], rel=1e-4)


def test_micro_batch_1_and_2_give_the_same_new_weights(trainer, replay):
    """Micro-batches of 1 or 2 samples accumulate to the same update (global token normalisation)."""
    batch, start, _ = replay
    _update(trainer, batch)  # micro-batch 2 (the fixture's)
    micro_2 = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
    _update(trainer, batch, micro_batch_size_per_device_for_update=1)
    micro_1 = trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]
    moved = _max_diff(micro_2, start)
    assert moved > 1e-4 and _max_diff(micro_1, micro_2) < 1e-2 * moved, (_max_diff(micro_1, micro_2), moved)


def test_second_ppo_epoch_is_off_policy(trainer, replay):
    """ppo_epochs = 2 over one mini-batch: epoch 1 on policy, epoch 2 off policy (ratio moved, clipping acts)."""
    batch, *_ = replay
    epochs = _update(trainer, batch, ppo_epochs=2, global_batch_size=trainer.config.data.rollout_batch_size, **TIGHT)
    assert len(epochs["actor/ppo_kl"]) == 2
    assert abs(epochs["actor/ppo_kl"][0]) < 1e-4 and epochs["actor/pg_clipfrac"][0] == 0.0
    assert abs(epochs["actor/ppo_kl"][1]) > 1e-4 and epochs["actor/pg_clipfrac"][1] > 0.0


@pytest.fixture(scope="module")
def kl_in_reward_steps(trainer):
    """Two steps with the KL in the reward and the adaptive controller (horizon 10 samples, so that it moves), with
    the estimators REINFORCE++ and REINFORCE++ with baseline (``HOSTED_ESTIMATORS``): ``(metrics, token_level_rewards,
    token_level_scores, KL(old, ref) per token, batch size, estimator, batch)`` per step."""
    from easyrl.algorithms.kl import kl_penalty, make_kl_controller

    algo, actor = trainer.config.algorithm, trainer.config.worker.actor
    algo.use_kl_loss, algo.use_kl_in_reward, algo.kl_type, algo.kl_horizon = False, True, "adaptive", 10.0
    actor.use_kl_loss = False
    trainer.kl_ctrl = make_kl_controller(algo.kl_type, algo.kl_coef, algo.kl_target, algo.kl_horizon)
    trainer.workers.run_all(InspectableWorker.update_config, trainer.config)
    stream = trainer.prompt_stream()
    try:
        steps = []
        for estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
            algo.adv_estimator = estimator
            metrics = trainer.train_step(stream)
            batch = trainer.last_batch
            kl = kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], algo.kl_penalty) * batch["response_mask"]
            steps.append((metrics, batch["token_level_rewards"], batch["token_level_scores"], kl, len(batch),
                          estimator, batch))
    finally:
        algo.adv_estimator = "grpo"
        algo.use_kl_loss, algo.use_kl_in_reward, algo.kl_type, algo.kl_horizon = True, False, "fixed", 10000.0
        actor.use_kl_loss = True
        trainer.kl_ctrl = make_kl_controller(algo.kl_type, algo.kl_coef, algo.kl_target, algo.kl_horizon)
        trainer.workers.run_all(InspectableWorker.update_config, trainer.config)
    return steps


def test_kl_in_reward_rewards_are_scores_minus_beta_kl(kl_in_reward_steps):
    """Token rewards are scores - beta * KL(old, ref) per token, with the beta the step reports."""
    import torch

    for metrics, rewards, scores, kl, _, estimator, batch in kl_in_reward_steps:
        _check_estimator_step(metrics, batch, estimator)  # finite metrics included
        assert "actor/kl_loss" not in metrics
        assert kl.abs().max() > 0  # the actor has moved from the reference: the penalty is not trivially 0
        torch.testing.assert_close(rewards, scores - metrics["actor/reward_kl_penalty_coeff"] * kl)


def test_kl_in_reward_coefficient_follows_the_adaptive_controller(kl_in_reward_steps, trainer):
    """beta after step 1 = beta * (1 + clip(KL / target - 1, -0.2, 0.2) * batch size / horizon) (Ziegler et al.)."""
    (first, _, _, _, size, *_), (second, *_) = kl_in_reward_steps
    error = min(max(first["actor/reward_kl_penalty"] / trainer.config.algorithm.kl_target - 1, -0.2), 0.2)
    expected = first["actor/reward_kl_penalty_coeff"] * (1 + error * size / 10.0)
    assert second["actor/reward_kl_penalty_coeff"] == pytest.approx(expected, rel=1e-6)
    assert second["actor/reward_kl_penalty_coeff"] != pytest.approx(first["actor/reward_kl_penalty_coeff"])


def test_disable_kl_skips_the_reference_forward(trainer):
    """With GPG's advantages (a KL-free method; ``HOSTED_ESTIMATORS``)."""
    algo = trainer.config.algorithm
    algo.disable_kl = True
    trainer.config.worker.actor.disable_kl = True
    trainer.workers.run_all(InspectableWorker.update_config, trainer.config)
    try:
        metrics = _steps(trainer, 1, "gpg")[0]
    finally:
        algo.disable_kl = False
        trainer.config.worker.actor.disable_kl = False
        trainer.workers.run_all(InspectableWorker.update_config, trainer.config)
    _check_estimator_step(metrics, trainer.last_batch, "gpg")  # finite metrics included
    assert "timing_s/ref" not in metrics and "actor/kl_loss" not in metrics
    assert "ref_log_probs" not in trainer.last_batch


def test_truncated_importance_sampling_at_temperature_0_7(trainer):
    """vLLM's sampled-token log-probs travel with the batch at temperature 0.7: they equal the actor's log-probs of
    softmax(logits / 0.7) within the fp32 tolerance (an actor ignoring the temperature would be off by far more), so
    the TIS weights exp(old - rollout), capped, are 1 up to kernel noise. With RLOO's advantages
    (``HOSTED_ESTIMATORS``)."""
    rollout, actor = trainer.config.worker.rollout, trainer.config.worker.actor
    rollout.calculate_log_probs, actor.tis_cap = True, 2.0
    rollout.temperature = actor.temperature = 0.7
    trainer.workers.run_all(InspectableWorker.update_config, trainer.config)
    try:
        metrics = _steps(trainer, 1, "rloo")[0]
    finally:
        rollout.calculate_log_probs, actor.tis_cap = False, None
        rollout.temperature = actor.temperature = 1.0
        trainer.workers.run_all(InspectableWorker.update_config, trainer.config)
    _check_estimator_step(metrics, trainer.last_batch, "rloo")  # finite metrics included
    assert metrics["rollout/log_prob_diff_max"] < FP32_LOGPROB_TOL, metrics["rollout/log_prob_diff_max"]
    assert metrics["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=FP32_LOGPROB_TOL)
    assert "rollout_log_probs" in trainer.last_batch


def _swap_reward(trainer, fn):
    """Score with ``fn`` behind a guard of its own (a plain callable cannot run in the guard's helper process);
    returns the trainer's guard, to put back."""
    from easyrl.rewards.guard import GuardedReward

    saved = trainer.scorer.guard
    trainer.scorer.guard = GuardedReward(fn, on_error="raise")
    return saved


def test_dynamic_sampling_gives_up_after_max_try_make_batch(trainer):
    """A reward that never varies leaves no group to keep: after max_try_make_batch rounds the step fails, naming
    the key."""
    algo = trainer.config.algorithm
    saved_guard = _swap_reward(trainer, lambda inputs: {"overall": [0.5] * len(inputs)})
    algo.online_filtering, algo.max_try_make_batch = True, 1
    try:
        with pytest.raises(RuntimeError, match=r"kept 0 of 4 groups after 1 generation rounds.*max_try_make_batch"):
            _steps(trainer, 1)
    finally:
        trainer.scorer.guard = saved_guard
        algo.online_filtering, algo.max_try_make_batch = False, 20


def test_dynamic_sampling_drops_constant_groups_and_refills(trainer):
    """Half of the problems get a constant reward: their groups are dropped and more prompts are generated until
    the batch holds rollout_batch_size groups that all vary. With OPO's advantages (``HOSTED_ESTIMATORS``)."""
    from easyrl.rewards.function import RewardFunction

    algo = trainer.config.algorithm
    half_constant = RewardFunction(f"{REPO / 'tests/reward_functions/half_constant.py'}:compute_score")
    generated: list[float] = []

    def recording_reward(inputs):  # the real reward function; records every generated sample's score
        scores = half_constant(inputs)
        generated.extend(scores["overall"])
        return scores

    saved_guard = _swap_reward(trainer, recording_reward)
    algo.online_filtering, algo.filter_low, algo.filter_high = True, None, None
    try:
        metrics = _steps(trainer, 1, "opo")[0]
    finally:
        trainer.scorer.guard = saved_guard
        algo.online_filtering, algo.filter_low, algo.filter_high = False, 0.01, 0.99
    batch = trainer.last_batch
    _check_estimator_step(metrics, batch, "opo")
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
