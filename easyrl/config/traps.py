"""Warnings at config load for settings that run, but silently differ from what a paper or a verl recipe means, or
have no effect in the chosen mode.

Each check is a pure function of the finalized config returning messages that name the keys and the reference setting;
:func:`warn_config_traps` emits them as :class:`ConfigWarning` (a ``UserWarning``), before any model is loaded. None of
them is an error: the setting may be intended.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from easyrl.config.ppo import PPOConfig

__all__ = ["ConfigWarning", "warn_config_traps"]


class ConfigWarning(UserWarning):
    """A setting that differs from its paper's or verl's meaning (see ``warn_config_traps``)."""


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


def _no_effect_messages(config: PPOConfig) -> list[str]:
    """Settings that have no effect in the chosen mode, or place work where it is slow: probably not what was meant."""
    rollout, mt, judge = config.worker.rollout, config.worker.rollout.multi_turn, config.worker.reward.judge
    key, messages = "worker.rollout.multi_turn", []
    if not mt.enable and (mt.tools or mt.environment):
        messages.append(f"{key}.tools / environment are set but {key}.enable=false: the rollout is single-turn and "
                        f"never calls them. Set {key}.enable=true to use them.")
    if mt.enable and mt.max_user_turns is not None and mt.environment is None:
        messages.append(f"{key}.max_user_turns={mt.max_user_turns} has no effect without {key}.environment (only "
                        "an environment adds user turns).")
    if mt.enable and mt.max_turn_tokens is not None and mt.max_turn_tokens >= config.data.max_response_length:
        messages.append(f"{key}.max_turn_tokens={mt.max_turn_tokens} is not below data.max_response_length="
                        f"{config.data.max_response_length}, the whole trajectory's budget: it limits no turn.")
    if judge.model_path is not None and judge.weight == 0:
        messages.append("worker.reward.judge.weight=0: the judge runs on every sample but its score does not enter "
                        "the reward (only reward/judge is logged). Give it a weight, or set "
                        "worker.reward.judge.model_path=null.")
    if config.worker.teacher.model.model_path and not config.algorithm.needs_teacher:
        messages.append("worker.teacher.model.model_path is set but distillation is off (algorithm.distill_coef=0, "
                        f"algorithm.adv_estimator={config.algorithm.adv_estimator}): no teacher is loaded. Set "
                        "algorithm.distill_coef > 0 or algorithm.adv_estimator=on_policy_distill to use it.")
    if config.algorithm.needs_teacher and config.worker.teacher.model.model_path == config.worker.actor.model.model_path:
        messages.append("worker.teacher.model.model_path is the student's own model (worker.actor.model.model_path): "
                        "the reverse KL starts at 0 and distillation teaches nothing new. Give a larger model of the "
                        "same family.")
    data = config.data
    if data.prompt_key == data.answer_key:
        messages.append(f"data.prompt_key and data.answer_key both name the column {data.prompt_key!r}: the reward "
                        "compares each response with the problem itself. Set data.answer_key to the reference "
                        "answer's column.")
    system = (data.system_prompt or "").strip()
    if system and " " not in system and system.endswith((".txt", ".md", ".jinja", ".j2", ".yaml")):
        messages.append(f"data.system_prompt={system!r} looks like a file name, but it is the system message's text "
                        "itself (no file is read): write the text, e.g. data.system_prompt=\"You are ...\".")
    for name in config.worker.env_vars:
        if str(name) != str(name).upper():
            messages.append(f"worker.env_vars has {name!r}: environment variable names are case-sensitive, and the "
                            f"usual ones are upper case; if {str(name).upper()} is meant, write it so.")
    tp, per_node = rollout.tensor_parallel_size, config.trainer.n_gpus_per_node
    if config.trainer.nnodes > 1 and per_node % tp != 0:
        messages.append(f"worker.rollout.tensor_parallel_size={tp} does not divide trainer.n_gpus_per_node="
                        f"{per_node}: some vLLM engines span two nodes and all-reduce over the network at every "
                        "layer (slow). Choose a size that divides the devices of one node.")
    return messages


def warn_config_traps(config: PPOConfig) -> list[str]:
    """Warn (:class:`ConfigWarning`) of every trap the finalized ``config`` falls into, one message each naming the
    keys, their values and the paper's or verl's setting; returns the messages."""
    messages = _loss_messages(config) + _sampling_messages(config) + _no_effect_messages(config)
    for message in messages:
        warnings.warn(message, ConfigWarning, stacklevel=2)  # the caller's line (load_config's)
    return messages
