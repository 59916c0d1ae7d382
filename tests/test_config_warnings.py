"""Warnings at config load for settings that silently differ from their paper's or verl's meaning: each one fires on
its trap, names the keys and the reference setting, and stays silent on the recommended setting."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from easyrl.config import load_config
from easyrl.config.checks import ConfigWarning

REPO = Path(__file__).resolve().parents[1]
BASE = [f"config={REPO / 'config.yaml'}"]


def _load(*overrides: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config([*BASE, *overrides])
    return [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def test_default_config_has_no_warning():
    assert _load() == []


@pytest.mark.parametrize("trap, fix, words", [
    (["worker.actor.loss_agg_mode=seq-mean-token-sum-norm"],
     ["worker.actor.loss_agg_mode=seq-mean-token-sum-norm-drgrpo"],
     ["seq-mean-token-sum-norm", "verl 0.7.1-0.9.1", "640x", "max_grad_norm"]),
    (["worker.actor.loss_type=gspo"],
     ["worker.actor.loss_type=gspo", "worker.actor.loss_agg_mode=seq-mean-token-mean",
      "worker.actor.clip_ratio_low=3e-4", "worker.actor.clip_ratio_high=4e-4"],
     ["worker.actor.loss_type=gspo", "loss_agg_mode=token-mean", "0.28", "3e-4", "seq-mean-token-mean"]),
    (["worker.actor.loss_type=cispo"],
     ["worker.actor.loss_type=cispo", "worker.actor.clip_ratio_low=1.0"],
     ["worker.actor.loss_type=cispo", "clip_ratio_low=0.2", "no lower bound", "worker.actor.clip_ratio_low: 1.0"]),
    (["worker.actor.loss_type=sapo"],
     ["worker.actor.loss_type=sapo", "worker.actor.loss_agg_mode=seq-mean-token-mean"],
     ["worker.actor.loss_type=sapo", "loss_agg_mode=token-mean", "seq-mean-token-mean"]),
    (["algorithm.online_filtering=true"],
     ["algorithm.online_filtering=true", "algorithm.filter_key=accuracy"],
     ["algorithm.online_filtering", "filter_key=overall", "filter_low=0.01", "[0, 1]", "algorithm.filter_key=accuracy"]),
    (["worker.actor.tis_cap=2.0", "worker.rollout.calculate_log_probs=true", "worker.rollout.top_p=0.9"],
     ["worker.actor.tis_cap=2.0", "worker.rollout.calculate_log_probs=true"],
     ["worker.rollout.top_p=0.9", "tis_cap=2.0", "truncated"]),
    (["worker.rollout.calculate_log_probs=true", "worker.rollout.top_k=50"],
     ["worker.rollout.calculate_log_probs=true", "worker.rollout.top_k=-1"],
     ["top_k=50", "truncated"]),
])
def test_each_trap_warns_with_keys_and_the_reference_setting(trap, fix, words):
    messages = _load(*trap)
    assert len(messages) == 1, messages
    for word in words:
        assert word in messages[0], (word, messages[0])
    assert _load(*fix) == []


def test_a_best_metric_that_ranks_no_checkpoint_or_only_some_is_warned_of():  # W26
    """config.yaml validates every 5 steps: saves every 4 leave steps 4, 8, ... unranked; with ``val_freq=-1`` a
    best metric of the user's own ranks nothing. The default (``val/reward/overall``) with ``val_freq=-1``, and saves
    only at the last step (the demo's two steps), are silent."""
    (message,) = _load("trainer.save_freq=4")
    for word in ("trainer.save_freq=4 is not a multiple of trainer.val_freq=5", "(step 4, ...) are not ranked",
                 "multiples of 20"):
        assert word in message, message
    (message,) = _load("trainer.val_freq=-1", "trainer.best_metric=val/reward/accuracy")
    assert "trainer.best_metric='val/reward/accuracy'" in message and "no checkpoint is ranked" in message
    assert _load("trainer.save_freq=10") == [] and _load("trainer.val_freq=-1") == []
    assert _load("trainer.save_freq=4", "trainer.max_steps=4") == []
