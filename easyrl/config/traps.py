"""Warnings at config load for settings that run, but silently differ from what a paper or a verl recipe means.

Each check is a pure function of the finalized config returning messages that name the keys and the reference setting;
:func:`warn_config_traps` emits them as :class:`ConfigWarning` (a ``UserWarning``), before any model is loaded. None of
them is an error: the setting may be intended.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from easyrl.config.ppo import PPOConfig

__all__ = ["ConfigWarning", "config_trap_messages", "warn_config_traps"]


class ConfigWarning(UserWarning):
    """A setting that differs from its paper's or verl's meaning (see ``config_trap_messages``)."""


def _loss_messages(config: PPOConfig) -> list[str]:
    from easyrl.algorithms.policy_losses import POLICY_LOSSES, PolicyLossSettings

    actor = config.worker.actor
    mode, paper_check = actor.loss_agg_mode, POLICY_LOSSES.trait(actor.loss_type, "paper_check")
    messages = []
    if mode == "seq-mean-token-sum-norm":
        seqs = actor.global_batch_size * config.worker.rollout.n
        messages.append(
            "worker.actor.loss_agg_mode=seq-mean-token-sum-norm averages over sequences as verl 0.7.1-0.9.1 (Dr. "
            f"GRPO); verl <= 0.7.0 and easyrl before it summed them, a loss {seqs}x (global_batch_size * rollout.n) "
            "larger: re-tune worker.actor.max_grad_norm if your config was written for the sum."
        )
    if paper_check is not None and (message := paper_check(actor.loss_type, PolicyLossSettings.of(actor))):
        messages.append(message)
    return messages


def _sampling_messages(config: PPOConfig) -> list[str]:
    algo, actor, rollout = config.algorithm, config.worker.actor, config.worker.rollout
    messages = []
    bounds = [b for b in (algo.filter_low, algo.filter_high) if b is not None]
    if algo.online_filtering and algo.filter_key == "overall" and bounds and all(0.0 <= b <= 1.0 for b in bounds):
        messages.append(
            f"algorithm.online_filtering with filter_key=overall, filter_low={algo.filter_low}, "
            f"filter_high={algo.filter_high}: the bounds apply to a group's mean score and assume scores in [0, 1]. "
            "With DAPO's +1/-1 reward (examples/reward_function/dapo.py) a filter_low of 0.01 drops every group with "
            "accuracy <= 50%. Filter on a 0/1 score (algorithm.filter_key=accuracy, as DAPO's recipe) or set bounds "
            "in your reward's range (null disables a bound)."
        )
    truncated = rollout.top_p < 1.0 or rollout.top_k > 0
    if truncated and (actor.tis_cap is not None or rollout.calculate_log_probs):
        messages.append(
            f"worker.rollout.top_p={rollout.top_p} / top_k={rollout.top_k} with worker.rollout.calculate_log_probs"
            f" (tis_cap={actor.tis_cap}): vLLM reports log-probs of the truncated (top-p/top-k) distribution while "
            "the actor computes the full one, so rollout/* mismatch metrics and TIS weights compare different "
            "distributions (the TIS blog and verl's rollout correction assume top_p=1, top_k=-1), and the weight-sync "
            "check (worker.actor.rollout_sync_threshold) is off."
        )
    greedy = (rollout.temperature == 0 or rollout.top_k == 1) and rollout.n > 1
    if greedy and not algo.estimator("group"):  # a group estimator learns nothing: an error (checks.py)
        messages.append(
            f"worker.rollout.temperature={rollout.temperature} / top_k={rollout.top_k} samples greedily, so the "
            f"worker.rollout.n={rollout.n} responses of each prompt are copies of one: "
            f"algorithm.adv_estimator={algo.adv_estimator} still learns, but from 1/{rollout.n} of the samples it "
            "generates. Set worker.rollout.n=1, or sample (worker.rollout.temperature=1.0)."
        )
    return messages


def config_trap_messages(config: PPOConfig) -> list[str]:
    """Every trap the configuration falls into, one message each (empty when none).

    Args:
        config: a finalized ``PPOConfig``.

    Returns:
        Messages naming the keys, their values and the paper's or verl's setting.
    """
    return _loss_messages(config) + _sampling_messages(config)


def warn_config_traps(config: PPOConfig) -> list[str]:
    """Emit :func:`config_trap_messages` as :class:`ConfigWarning`s; returns them."""
    messages = config_trap_messages(config)
    for message in messages:
        warnings.warn(message, ConfigWarning, stacklevel=2)  # the caller's line (load_config's)
    return messages
