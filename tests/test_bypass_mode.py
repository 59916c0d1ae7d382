"""``algorithm.bypass_mode`` (verl's rollout-correction bypass mode): where a step's old log-probs come from
(``PPOConfig.old_log_probs_source``), when vLLM's log-probs are of the distribution the actor scores
(``PPOConfig.sampling_mismatches``), the refusals before Ray (docs/errors.md C40-C42), the warning of a bypass that
saves nothing (W22), and the trainer's step with stand-in workers: no old-log-prob pass, the update's old log-probs
are vLLM's, no ``rollout/*`` metrics."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from easyrl.config import load_config
from easyrl.config.checks import warn_config_traps

REPO = Path(__file__).resolve().parents[1]
BASE = [f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m"]
ON_POLICY = ["worker.actor.global_batch_size=4"]  # one mini-batch of the 4 prompts, one epoch
BYPASS = ["algorithm.bypass_mode=true"]


def _config(*overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config([*BASE, *overrides])


@pytest.mark.parametrize("overrides, source", [
    ([], "recompute"),  # cpu_demo: 2 mini-batches, so the old policy must be kept apart
    (ON_POLICY, "update"),
    (BYPASS, "rollout"),
    ([*BYPASS, *ON_POLICY], "rollout"),  # bypass wins: the ratio is against vLLM's log-probs, not the update's own
    ([*BYPASS, "worker.actor.ppo_epochs=2"], "rollout"),
    ([*ON_POLICY, "worker.actor.rollout_is=token"], "recompute"),
    ([*BYPASS, "worker.actor.loss_type=bypass_mode", "worker.actor.rollout_is=token"], "rollout"),
])
def test_old_log_probs_source(overrides, source):
    assert _config(*overrides).old_log_probs_source == source


def test_sampling_mismatches_name_each_setting_that_changes_the_distribution():
    config = _config()
    assert config.sampling_mismatches == []
    assert _config("worker.rollout.top_p=0.9").sampling_mismatches == ["worker.rollout.top_p=0.9 (nucleus truncation)"]
    assert _config("worker.rollout.top_k=20").sampling_mismatches == ["worker.rollout.top_k=20 (top-k truncation)"]
    config.worker.rollout.temperature = 0.0
    assert config.sampling_mismatches == ["worker.rollout.temperature=0 (greedy: no sampling distribution)"]
    config.worker.rollout.temperature, config.worker.actor.temperature = 1.0, 0.7  # not reachable by load_config
    assert config.sampling_mismatches == ["worker.actor.temperature=0.7 (the rollout samples at "
                                          "worker.rollout.temperature=1.0)"]


def test_the_weight_sync_check_is_off_in_bypass_mode():
    assert _config().sync_check_threshold == 0.1
    assert _config(*BYPASS).sync_check_threshold is None  # no recompute to compare vLLM's log-probs with
    assert _config("worker.rollout.top_k=20").sync_check_threshold is None


@pytest.mark.parametrize("overrides, culprits", [
    pytest.param([*BYPASS, "worker.rollout.calculate_log_probs=false"],
                 ["algorithm.bypass_mode=true", "worker.rollout.calculate_log_probs=true"], id="C40"),
    pytest.param([*BYPASS, "worker.rollout.top_p=0.9"],
                 ["algorithm.bypass_mode=true", "worker.rollout.top_p=0.9", "top_k=-1"], id="C41"),
    pytest.param([*BYPASS, "worker.actor.rollout_is=token"],
                 ["algorithm.bypass_mode=true", "worker.actor.rollout_is", "worker.actor.loss_type=bypass_mode"],
                 id="C42"),
])
def test_bypass_mode_refused_where_it_cannot_apply(expect_user_error, overrides, culprits):
    expect_user_error(lambda: load_config([*BASE, *overrides]), "config", *culprits)


@pytest.mark.parametrize("overrides, culprits", [
    (["worker.rollout.top_k=20"], ["worker.rollout.top_k=20"]),
    (["worker.actor.tis_cap=2.0", "worker.actor.rollout_rs=token_k1", "worker.actor.rollout_rs_threshold=0.5_2.0"],
     ["worker.actor.tis_cap, worker.actor.rollout_rs"]),
])
def test_each_truncation_and_correction_is_named(expect_user_error, overrides, culprits):
    expect_user_error(lambda: load_config([*BASE, *BYPASS, *overrides]), "config", *culprits)


def test_corrections_computed_inside_the_bypass_loss_are_accepted():
    config = _config(*BYPASS, "worker.actor.loss_type=bypass_mode", "worker.actor.rollout_is=sequence",
                     "worker.actor.rollout_rs=token_k1", "worker.actor.rollout_rs_threshold=0.5_2.0")
    assert config.algorithm.bypass_mode and config.worker.actor.rollout_is == "sequence"


def test_an_on_policy_colocated_bypass_is_warned_of_as_saving_nothing():  # W22
    def bypass_warnings(config):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [m for m in warn_config_traps(config) if m.startswith("algorithm.bypass_mode")]

    (message,) = bypass_warnings(_config(*BYPASS, *ON_POLICY))
    assert "saves no pass" in message and "worker.actor.rollout_sync_threshold" in message
    assert bypass_warnings(_config(*BYPASS)) == []  # 2 mini-batches: the pass it skips would have run
    assert bypass_warnings(_config(*ON_POLICY)) == []
    split = _config(*BYPASS, *ON_POLICY)
    split.trainer.rollout_mode = "one_step_off"  # the behaviour policy is older: the ratio then corrects for it
    assert bypass_warnings(split) == []


# -- the trainer's step with stand-in workers -------------------------------------------------------------------


class _Workers:
    """Stands in for the WorkerGroup: records the passes it is asked for and what the update received."""

    world_size = dp_size = 2

    def __init__(self, actor_log_probs: torch.Tensor):
        self.actor_log_probs = actor_log_probs
        self.passes: list[str] = []
        self.update_old_log_probs = None

    def run_split(self, method, batch):
        self.passes.append(method.__name__)
        if method.__name__ == "compute_log_probs":
            return [self.actor_log_probs.clone()]
        if method.__name__ == "compute_ref_log_probs":
            return [self.actor_log_probs.clone()]
        assert method.__name__ == "update_actor"
        metrics = {"actor/pg_loss": [0.0]}
        if "old_log_probs" in batch:
            self.update_old_log_probs = batch["old_log_probs"].clone()
        else:  # on-policy: the update returns its own log-probs (FSDPWorker.update_actor)
            metrics["old_log_probs"] = self.actor_log_probs.clone()
        return [metrics]


def _step(*overrides):
    """One ``RayPPOTrainer.train_step`` of 8 samples (4 prompts x 2) with stand-in workers; returns the metrics,
    the workers and the batch's vLLM log-probs."""
    from easyrl.batch import Batch
    from easyrl.trainer.ray_trainer import RayPPOTrainer
    from easyrl.trainer.rollout import trajectory_batch

    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # the step alone: no Ray, no models, no data
    trainer.config = _config("worker.rollout.n=2", *overrides)
    trainer.global_step, trainer._last_frac_zero_std, trainer.startup, trainer.model_shape = 1, None, None, None
    bsz, prompt_len, resp_len = 8, 3, 4
    prompts = Batch(TensorDict({"prompts": torch.ones(bsz, prompt_len, dtype=torch.long),
                                "prompt_mask": torch.ones(bsz, prompt_len, dtype=torch.long)}, batch_size=[bsz]),
                    {"uid": [i // 2 for i in range(bsz)]})
    generator = torch.Generator().manual_seed(0)
    rollout = (-torch.rand(bsz, resp_len, generator=generator)).tolist()
    batch = trajectory_batch(prompts, [[5] * resp_len] * bsz, resp_len, 0, log_probs=rollout)
    scores = torch.zeros(bsz, resp_len)
    scores[::2, -1] = 1.0  # one sample of each group is right: non-zero advantages
    batch["token_level_scores"] = scores
    trainer.workers = _Workers(batch["rollout_log_probs"] - 0.5)  # the actor's log-probs: far from vLLM's
    trainer.batches = SimpleNamespace(next_batch=lambda *args: (batch, None, {}, 0), step_done=lambda metrics: None)
    trainer.generator = SimpleNamespace(rollout=SimpleNamespace(slot_occupancy=lambda: None))
    trainer.model_rewards = SimpleNamespace(run=lambda *args: None)
    return trainer.train_step(iter(())), trainer.workers, batch["rollout_log_probs"]


def test_a_bypass_step_runs_no_old_log_prob_pass_and_updates_against_vllm():
    metrics, workers, rollout_log_probs = _step(*BYPASS, "algorithm.disable_kl=true")
    assert workers.passes == ["update_actor"]
    assert "timing_s/old_log_prob" not in metrics
    assert not [name for name in metrics if name.startswith("rollout/") and name != "rollout/slot_occupancy"]
    # balanced and restored order aside, the update's old log-probs are vLLM's, row for row
    assert sorted(map(tuple, workers.update_old_log_probs.tolist())) == sorted(map(tuple, rollout_log_probs.tolist()))


def test_the_same_step_without_bypass_recomputes_and_checks_the_gap():
    from easyrl.workers.weight_sync import WeightSyncError

    with pytest.raises(WeightSyncError):  # the stand-in actor is 0.5 nats off vLLM: the weight-sync check stops it
        _step("algorithm.disable_kl=true")
    metrics, workers, _ = _step("algorithm.disable_kl=true", "worker.actor.rollout_sync_threshold=null")
    assert workers.passes == ["compute_log_probs", "update_actor"]
    assert "timing_s/old_log_prob" in metrics and metrics["rollout/log_prob_diff_median"] == pytest.approx(0.5)



def test_a_sync_threshold_without_comparable_log_probs_is_warned_of_as_doing_nothing():  # W24
    def threshold_warnings(*overrides):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_config([*BASE, *overrides])
        return [str(w.message) for w in caught if str(w.message).startswith("worker.actor.rollout_sync_threshold")]

    (message,) = threshold_warnings("worker.actor.rollout_sync_threshold=0.05", *BYPASS)
    assert "=0.05 has no effect" in message and "algorithm.bypass_mode=true" in message and "null" in message
    (message,) = threshold_warnings("worker.actor.rollout_sync_threshold=0.05",
                                    "worker.rollout.calculate_log_probs=false")
    assert "worker.rollout.calculate_log_probs=false" in message
    assert threshold_warnings("worker.actor.rollout_sync_threshold=0.05") == []  # checked: colocated, untruncated
    assert threshold_warnings(*BYPASS) == []  # the default: not the user's setting
