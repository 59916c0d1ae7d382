"""Checks of a finalized configuration's values that span sections, before anything is loaded. A value's type, range
or choice is on its field, a section's own rules in its ``check`` method. Each failure raises ``ConfigError`` naming
the key, the value and what to set.

Settings that run but differ from what a paper means, or have no effect in the chosen mode, are warned of instead
(:func:`warn_config_traps`, :class:`ConfigWarning`): each trap is a pure function of the config returning messages
that name the keys and the reference setting.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import TYPE_CHECKING, Any

from easyrl.config.actor import check_distillation, teachers_of
from easyrl.config.algorithm import check_bypass_mode
from easyrl.config.judge import check_judge
from easyrl.config.placement import check_replay, check_rollout_mode
from easyrl.config.ppo import OldLogProbs
from easyrl.config.worker import check_multi_turn, check_reward_model, check_spec
from easyrl.errors import ConfigError

if TYPE_CHECKING:
    from easyrl.config.ppo import PPOConfig


def check_tensor_parallel(world_size: int, tensor_parallel_size: int) -> None:
    """``ConfigError`` (naming the key, the device count and the sizes that would fit) unless
    ``tensor_parallel_size`` (>= 1) divides ``world_size``: each vLLM engine spans that many devices."""
    if tensor_parallel_size < 1 or world_size % tensor_parallel_size != 0:
        fits = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ConfigError(
            f"worker.rollout.tensor_parallel_size={tensor_parallel_size} does not divide the {world_size} devices "
            f"(trainer.nnodes * trainer.n_gpus_per_node): each vLLM engine spans tensor_parallel_size devices, so "
            f"choose one of {', '.join(map(str, fits))}."
        )


def check_divisibility(config: PPOConfig) -> None:
    """Batch sizes that must split evenly: rollout batch into mini-batches, mini-batch samples over the devices, a
    device's share into micro-batches (batch sizes in prompts, micro-batches in samples), for the actor and the
    critic; and, where the engines share the trainer's devices (``trainer.rollout_mode=colocated``), a generation
    round's samples over those devices and the devices into vLLM engines (split engines are counted by
    ``easyrl.config.placement.check_rollout_mode``, and take any number of prompts: the request stream spreads them)."""
    check_sequence_parallel(config)
    for role in ["actor"] + (["critic"] if config.algorithm.needs_critic else []):
        _check_batch_split(config, role)
    if config.trainer.rollout_mode != "colocated":
        return
    mini = config.data.mini_rollout_batch_size
    if mini is not None and mini * config.worker.rollout.n % config.world_size != 0:
        raise ConfigError(
            f"data.mini_rollout_batch_size * worker.rollout.n ({mini * config.worker.rollout.n}) samples must split "
            f"evenly over {config.world_size} devices (trainer.nnodes * trainer.n_gpus_per_node)."
        )
    check_tensor_parallel(config.world_size, config.worker.rollout.tensor_parallel_size)


def check_sequence_parallel(config: PPOConfig) -> None:
    """``worker.actor.ulysses_size`` divides the devices and comes with what it was built for: padding-free forwards
    (actor and, with GAE, critic), no MoE router loss (each rank's router sees only its slice of the tokens). The
    model's heads are checked with its config (``easyrl.trainer.preflight``)."""
    size, world = config.worker.actor.ulysses_size, config.world_size
    if size == 1:
        return
    if world % size:
        raise ConfigError(f"worker.actor.ulysses_size={size} must divide the {world} devices (trainer.nnodes * "
                          "trainer.n_gpus_per_node): each sequence-parallel group is ulysses_size devices.")
    roles = ["actor"] + (["critic"] if config.algorithm.needs_critic else [])
    for role in roles:
        if not getattr(config.worker, role).padding_free:
            raise ConfigError(f"worker.actor.ulysses_size={size} splits packed rows: set worker.{role}.padding_free="
                              "true (or ulysses_size=1).")
    if config.worker.actor.router_aux_loss_coef > 0:
        raise ConfigError(f"worker.actor.ulysses_size={size} with worker.actor.router_aux_loss_coef > 0 is not "
                          "implemented (each rank's router sees only its slice of a sequence): set one of them to "
                          "0 or 1.")


def _check_batch_split(config: PPOConfig, role: str) -> None:
    section, cfg = f"worker.{role}", getattr(config.worker, role)
    global_batch_size, micro_batch_size = cfg.global_batch_size, cfg.micro_batch_size_per_device_for_update
    if config.data.rollout_batch_size % global_batch_size != 0:
        raise ConfigError(
            f"data.rollout_batch_size ({config.data.rollout_batch_size}) must be a multiple of "
            f"{section}.global_batch_size ({global_batch_size})."
        )
    samples_per_minibatch = global_batch_size * config.worker.rollout.n
    if samples_per_minibatch % config.dp_size != 0:
        over = (f"{config.world_size} devices (trainer.nnodes * trainer.n_gpus_per_node)" if config.dp_size ==
                config.world_size else f"{config.dp_size} data-parallel groups (devices / worker.actor.ulysses_size)")
        raise ConfigError(
            f"{section}.global_batch_size * worker.rollout.n ({samples_per_minibatch}) samples must split "
            f"evenly over {over}."
        )
    per_device = config.mini_batch_samples(role)
    if per_device % micro_batch_size != 0:
        raise ConfigError(
            f"{per_device} samples per device per mini-batch are not a multiple of "
            f"{section}.micro_batch_size_per_device_for_update ({micro_batch_size})."
        )


def check_combinations(config: PPOConfig) -> None:
    """Settings of different sections that only make sense together."""
    from easyrl.algorithms.policy_losses import POLICY_LOSSES

    actor, algo = config.worker.actor, config.algorithm
    uses_engine = {"worker.actor.tis_cap": actor.tis_cap is not None,
                   "worker.actor.rollout_is": actor.rollout_is is not None,
                   "worker.actor.rollout_rs": actor.rollout_rs is not None,
                   f"worker.actor.loss_type={actor.loss_type}": POLICY_LOSSES.trait(actor.loss_type,
                                                                                    "uses_engine_log_probs")}
    for key, used in uses_engine.items():
        if used and config.worker.rollout.calculate_log_probs is False:
            raise ConfigError(f"{key} needs worker.rollout.calculate_log_probs=true (vLLM's sampled-token log-probs).")
    longest = config.data.max_prompt_length + config.data.max_response_length
    for section in ("actor", "critic"):
        role = getattr(config.worker, section)
        budget, sp = role.max_token_len_per_device, config.worker.actor.ulysses_size
        if role.dynamic_batching and budget is not None and budget * sp < longest:
            split = f" split over worker.actor.ulysses_size={sp} devices" if sp > 1 else ""
            raise ConfigError(
                f"worker.{section}.max_token_len_per_device={budget} is below the longest sample{split}, "
                f"data.max_prompt_length + data.max_response_length = {longest}: raise it (or leave it null)."
            )
    if algo.needs_critic and config.worker.critic.model.lora.rank > 0:
        raise ConfigError("worker.critic.model.lora.rank must be 0: the critic (algorithm.adv_estimator=gae) trains "
                          "all its weights (LoRA applies to the actor only, worker.actor.model.lora).")
    if config.trainer.val_only and not config.data.val_files:
        raise ConfigError("trainer.val_only=true validates on data.val_files, which is not set: give "
                          "data.val_files=PATH (the validation set; easyrl eval needs it too).")
    if config.trainer.critic_warmup > 0 and not algo.needs_critic:
        raise ConfigError(f"trainer.critic_warmup={config.trainer.critic_warmup} needs a critic "
                          "(algorithm.adv_estimator=gae); set it to 0.")


def check_greedy_groups(config: PPOConfig) -> None:
    """Greedy sampling (``worker.rollout.temperature=0`` or ``top_k=1``) with ``n > 1`` and a group-relative
    estimator (its ``group`` trait): the ``n`` samples of a prompt are identical, every advantage is 0 and the policy
    never moves (only the KL term acts). Without a group baseline it only duplicates work: :func:`warn_config_traps`.
    """
    rollout, estimator = config.worker.rollout, config.algorithm.adv_estimator
    greedy = "temperature=0" if rollout.temperature == 0 else "top_k=1" if rollout.top_k == 1 else None
    if greedy and rollout.n > 1 and config.algorithm.estimator("group"):
        raise ConfigError(
            f"worker.rollout.{greedy} samples greedily, so the worker.rollout.n={rollout.n} responses of each prompt "
            f"are identical and every advantage of algorithm.adv_estimator={estimator} (relative to its group) is 0: "
            "nothing would be learned. Sample with worker.rollout.temperature=1.0 (and top_k=-1); keep greedy "
            "decoding for validation (worker.rollout.val_override_config)."
        )


def check_config(config: PPOConfig) -> None:
    """All value checks of a merged configuration; ``ConfigError`` for the first failing one."""
    if not config.worker.actor.model.model_path:
        raise ConfigError("worker.actor.model.model_path is not set: give a hub id or a local model folder.")
    for section in (config.data, config.algorithm, config.worker.actor, config.worker.rollout, config.worker,
                    config.trainer):
        section.check()
    check_divisibility(config)
    check_combinations(config)
    check_greedy_groups(config)
    check_multi_turn(config.worker.rollout.multi_turn)
    check_agent(config)
    check_judge(config.worker.reward.judge, config.worker.rollout.tensor_parallel_size)
    check_reward_model(config)
    check_distillation(config)
    check_bypass_mode(config)
    check_rollout_mode(config)
    check_replay(config)
    check_router_replay(config)


def check_router_replay(config: PPOConfig) -> None:
    """``worker.actor.router_replay.mode: R2`` needs an old-log-prob pass to record (R3's model is checked by the
    pre-flight, ``easyrl.trainer.preflight.check_router_replay_model``; a dump replay by
    ``rollout_dump.check_replay``). ``ConfigError`` naming what to set."""
    replay = config.worker.actor.router_replay
    if replay.records_old and config.old_log_probs_source is not OldLogProbs.RECOMPUTE:
        why = ("algorithm.bypass_mode=true takes vLLM's log-probs as the old ones" if config.algorithm.bypass_mode
               else "the step is on-policy (one optimizer step), so the update's own routing is the old policy's")
        raise ConfigError(f"worker.actor.router_replay.mode=R2 replays the routing of the old-log-prob pass, which "
                          f"this run does not make ({why}): set worker.actor.router_replay.mode=R3 (the rollout's "
                          "routing) or disabled.")


def check_agent(config) -> None:
    """``worker.rollout.agent``: its file exists, and it is not combined with the built-in multi-turn rollout (the
    agent runs its own turns). ``ConfigError`` naming the key."""
    agent = config.worker.rollout.agent
    if not agent.enabled:
        return
    if config.worker.rollout.multi_turn.enable:
        raise ConfigError("worker.rollout.agent.entry_point and worker.rollout.multi_turn.enable=true both run the "
                          "turns: an agent calls its tools itself. Keep one: set worker.rollout.multi_turn.enable="
                          "false, or worker.rollout.agent.entry_point=null.")
    check_spec("worker.rollout.agent.entry_point", agent.entry_point)


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
    for teacher in teachers_of(config.worker) if config.algorithm.needs_teacher else []:
        if teacher.model.model_path == config.worker.actor.model.model_path:
            messages.append(f"{teacher.key}.model.model_path is the student's own model (worker.actor.model."
                            "model_path): the reverse KL starts at 0 and distillation teaches nothing new. Give a "
                            "larger model of the same family.")
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
    if config.algorithm.bypass_mode and config.on_policy_update and config.trainer.rollout_mode == "colocated":
        messages.append("algorithm.bypass_mode=true saves no pass here: the update is on-policy (worker.actor."
                        "ppo_epochs=1, worker.actor.global_batch_size = data.rollout_batch_size), so no old-log-prob "
                        "pass runs anyway. It only makes vLLM's log-probs the ratio's denominator instead of the "
                        "update's own and turns off the weight-sync check (worker.actor.rollout_sync_threshold) and "
                        "the rollout/* metrics. Drop it unless that is meant.")
    threshold = config.worker.actor.rollout_sync_threshold
    if threshold not in (None, _default(config.worker.actor, "rollout_sync_threshold")) and config.sync_check_off:
        messages.append(f"worker.actor.rollout_sync_threshold={threshold} has no effect: the weight-sync check it "
                        "sets compares vLLM's sampled-token log-probs with the actor's, and here "
                        f"{'; '.join(config.sync_check_off)}. Drop the key (or set it to null).")
    tp, per_node = rollout.tensor_parallel_size, config.trainer.n_gpus_per_node
    if config.trainer.nnodes > 1 and per_node % tp != 0 and config.trainer.rollout_mode == "colocated":
        messages.append(f"worker.rollout.tensor_parallel_size={tp} does not divide trainer.n_gpus_per_node="
                        f"{per_node}: some vLLM engines span two nodes and all-reduce over the network at every "
                        "layer (slow). Choose a size that divides the devices of one node.")
    return messages


def _ranking_messages(config: PPOConfig) -> list[str]:
    """``trainer.best_metric`` (a ``val/`` metric) ranks a checkpoint only where validation ran at its step: none
    with ``val_freq=-1``, and not those saved between validations."""
    t = config.trainer
    if not t.best_metric.startswith("val/") or config.data.val_files is None or t.val_only:
        return []
    chosen = (t.best_metric, t.best_metric_mode) != (_default(t, "best_metric"), _default(t, "best_metric_mode"))
    if t.val_freq == -1 and chosen:
        return [f"trainer.best_metric={t.best_metric!r} ranks checkpoints by a validation metric, but "
                "trainer.val_freq=-1 validates before training only: no checkpoint is ranked, and save_limit keeps "
                "the newest. Set trainer.val_freq (a divisor of trainer.save_freq)."]
    first_save = t.save_freq if t.max_steps is None or t.save_freq < t.max_steps else None
    if t.val_freq > 0 and t.save_freq > 0 and first_save and t.save_freq % t.val_freq:
        ranked = math.lcm(t.save_freq, t.val_freq)
        return [f"trainer.save_freq={t.save_freq} is not a multiple of trainer.val_freq={t.val_freq}: the checkpoints "
                f"saved without a validation (step {t.save_freq}, ...) are not ranked by trainer.best_metric="
                f"{t.best_metric!r}, only those at multiples of {ranked} and the last step's. Set trainer.save_freq to "
                "a multiple of trainer.val_freq."]
    return []


def _default(section: Any, name: str) -> Any:
    """The dataclass default of field ``name`` of ``section`` (a value the user did not change is not warned of)."""
    return next(f.default for f in dataclasses.fields(section) if f.name == name)


def warn_config_traps(config: PPOConfig) -> list[str]:
    """Warn (:class:`ConfigWarning`) of every trap the finalized ``config`` falls into, one message each naming the
    keys, their values and the paper's setting; returns the messages."""
    messages = (_loss_messages(config) + _sampling_messages(config) + _no_effect_messages(config)
                + _ranking_messages(config))
    for message in messages:
        warnings.warn(message, ConfigWarning, stacklevel=2)  # the caller's line (load_config's)
    return messages
