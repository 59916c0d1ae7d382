"""Checks of a merged configuration's values that span sections, before anything is loaded or started (called by
``load_config`` once ``PPOConfig.finalize`` has filled in the auto keys). A value's range or choice is on its field
(``easyrl.config.fields``), a section's own rules in its ``check`` method.

Order matters for the messages: every field is checked to be in range first (so that a zero never reaches a
division), then each section, then the sizes that must divide each other, then names chosen from a registry, then
settings that only make sense together. Each failure raises :class:`easyrl.errors.ConfigError` naming the key, the
value and what to set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from easyrl.config.fields import check_fields
from easyrl.config.judge import check_judge
from easyrl.config.multi_turn import check_multi_turn
from easyrl.config.reward_model import check_reward_model
from easyrl.config.split import check_rollout_mode
from easyrl.config.teacher import check_distillation
from easyrl.errors import ConfigError

if TYPE_CHECKING:
    from easyrl.config.ppo import PPOConfig

def check_choice(key: str, value: Any, choices: Any) -> None:
    """Raise ``ConfigError`` unless ``value`` is one of ``choices``, the names an ``easyrl.algorithms`` registry or
    tuple holds (a choice fixed in easyrl is a ``Literal`` on its field, checked by OmegaConf)."""
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(map(str, choices))}.")


def check_tensor_parallel(world_size: int, tensor_parallel_size: int) -> None:
    """Raise unless ``tensor_parallel_size`` (>= 1) divides ``world_size`` (the rollout's vLLM engines each span
    ``tensor_parallel_size`` devices; see ``easyrl.workers.rollout_layout``).

    Raises:
        ValueError: naming ``worker.rollout.tensor_parallel_size``, the device count and the sizes that would fit.
    """
    if tensor_parallel_size < 1 or world_size % tensor_parallel_size != 0:
        fits = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"worker.rollout.tensor_parallel_size={tensor_parallel_size} does not divide the {world_size} devices "
            f"(trainer.nnodes * trainer.n_gpus_per_node): each vLLM engine spans tensor_parallel_size devices, so "
            f"choose one of {', '.join(map(str, fits))}."
        )


def check_divisibility(config: "PPOConfig") -> None:
    """Batch sizes that must split evenly: rollout batch into mini-batches, mini-batch samples over the devices, a
    device's share into micro-batches (all counted as in EasyR1: batch sizes in prompts, micro-batches in samples),
    for the actor and, with ``algorithm.adv_estimator: gae``, the critic; a generation round's samples
    (``data.mini_rollout_batch_size``) over the devices; and the devices into vLLM engines of
    ``worker.rollout.tensor_parallel_size``."""
    check_sequence_parallel(config)
    sections = [("worker.actor", config.worker.actor)]
    if config.algorithm.needs_critic:
        sections.append(("worker.critic", config.worker.critic))
    for section, cfg in sections:
        _check_batch_split(config, section, cfg.global_batch_size, cfg.micro_batch_size_per_device_for_update)
    mini = config.data.mini_rollout_batch_size
    if mini is not None and mini * config.worker.rollout.n % config.world_size != 0:
        raise ConfigError(
            f"data.mini_rollout_batch_size * worker.rollout.n ({mini * config.worker.rollout.n}) samples must split "
            f"evenly over {config.world_size} devices (trainer.nnodes * trainer.n_gpus_per_node)."
        )
    try:
        check_tensor_parallel(config.world_size, config.worker.rollout.tensor_parallel_size)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_sequence_parallel(config: "PPOConfig") -> None:
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


def _check_batch_split(config: "PPOConfig", section: str, global_batch_size: int, micro_batch_size: int) -> None:
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
    per_device = samples_per_minibatch // config.dp_size
    if per_device % micro_batch_size != 0:
        raise ConfigError(
            f"{per_device} samples per device per mini-batch are not a multiple of "
            f"{section}.micro_batch_size_per_device_for_update ({micro_batch_size})."
        )


def check_names(config: "PPOConfig") -> None:
    """Names that select an implementation must exist (checked before any model is loaded)."""
    from easyrl.algorithms.advantages import ADV_ESTIMATORS
    from easyrl.algorithms.kl import KL_ESTIMATORS
    from easyrl.algorithms.loss_agg import LOSS_AGG_MODES
    from easyrl.algorithms.policy_losses import POLICY_LOSSES

    actor = config.worker.actor
    check_choice("algorithm.adv_estimator", config.algorithm.adv_estimator, list(ADV_ESTIMATORS))
    check_choice("algorithm.kl_penalty", config.algorithm.kl_penalty, KL_ESTIMATORS)
    check_choice("worker.actor.loss_type", actor.loss_type, list(POLICY_LOSSES))
    check_choice("worker.actor.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES)
    check_choice("worker.critic.loss_agg_mode", config.worker.critic.loss_agg_mode, LOSS_AGG_MODES)


def check_combinations(config: "PPOConfig") -> None:
    """Settings that only make sense together."""
    actor, rollout, algo = config.worker.actor, config.worker.rollout, config.algorithm
    if algo.use_kl_loss and algo.use_kl_in_reward:
        raise ConfigError("algorithm.use_kl_loss and algorithm.use_kl_in_reward are both true: choose one.")
    if rollout.calculate_log_probs is False and actor.tis_cap is not None:
        raise ConfigError("worker.actor.tis_cap needs worker.rollout.calculate_log_probs=true.")
    check_rollout_correction(config)
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


def check_rollout_correction(config: "PPOConfig") -> None:
    """``worker.actor``'s rollout correction and the losses that need a setting of their own (verl 0.9's family)."""
    from easyrl.algorithms.policy_losses import POLICY_LOSSES
    from easyrl.algorithms.rollout_correction import ROLLOUT_IS_LEVELS, parse_rs_thresholds

    actor, rollout = config.worker.actor, config.worker.rollout
    loss, engine_old = actor.loss_type, POLICY_LOSSES.trait(actor.loss_type, "uses_engine_log_probs")
    uses_engine = {"worker.actor.rollout_is": actor.rollout_is is not None,
                   "worker.actor.rollout_rs": actor.rollout_rs is not None,
                   f"worker.actor.loss_type={loss}": engine_old}
    for key, used in uses_engine.items():
        if used and rollout.calculate_log_probs is False:
            raise ConfigError(f"{key} needs worker.rollout.calculate_log_probs=true (vLLM's sampled-token log-probs).")
    if actor.rollout_is is not None:
        check_choice("worker.actor.rollout_is", actor.rollout_is, ROLLOUT_IS_LEVELS)
        if actor.tis_cap is not None:
            raise ConfigError("worker.actor.tis_cap and worker.actor.rollout_is are both set: tis_cap is token TIS, "
                              "the same as rollout_is=token with rollout_is_threshold=<cap>; keep one.")
    lower = actor.rollout_is_threshold_lower
    if lower is not None and lower > actor.rollout_is_threshold:
        raise ConfigError(f"worker.actor.rollout_is_threshold_lower={lower} is above rollout_is_threshold="
                          f"{actor.rollout_is_threshold}: IcePop keeps weights in [lower, upper].")
    if actor.rollout_rs is not None:
        if actor.rollout_rs_threshold is None:
            raise ConfigError("worker.actor.rollout_rs needs worker.actor.rollout_rs_threshold (e.g. \"0.5_2.0\" for "
                              "a k1 option, \"0.05\" for k2/k3).")
        try:
            from easyrl.algorithms.rollout_correction import ROLLOUT_RS_OPTIONS

            options = [o.strip() for o in actor.rollout_rs.split(",") if o.strip()]
            for option in options:
                check_choice("worker.actor.rollout_rs", option, ROLLOUT_RS_OPTIONS)
            parse_rs_thresholds(options, actor.rollout_rs_threshold)
        except ValueError as e:
            raise ConfigError(f"worker.actor.rollout_rs_threshold: {e}") from None
    if engine_old:
        check_choice("worker.actor.bypass_loss_type", actor.bypass_loss_type, ("ppo_clip", "reinforce"))
    if POLICY_LOSSES.trait(loss, "needs_dro_beta") and actor.dro_beta is None:
        raise ConfigError(f"worker.actor.loss_type={loss} needs worker.actor.dro_beta (> 0, the weight of the "
                          "quadratic log-ratio penalty).")
    if config.algorithm.estimator("needs_sum_pi_squared"):
        raise ConfigError(f"algorithm.adv_estimator={config.algorithm.adv_estimator} needs sum_v pi(v)^2 at every "
                          "response token, which easyrl's actor does not compute yet; choose another estimator (grpo, "
                          "opo).")


def check_greedy_groups(config: "PPOConfig") -> None:
    """Greedy sampling (``worker.rollout.temperature=0`` or ``top_k=1``) with ``n > 1`` and a group-relative
    estimator (its ``group`` trait): the ``n`` samples of a prompt are identical, every advantage is 0 and the policy
    never moves (only the KL term acts), so the run would spend its compute for nothing. An error, not a warning:
    nothing sensible goes on. With ``gae`` or ``reinforce_plus_plus`` (no group baseline) it only duplicates work:
    ``easyrl.config.traps``."""
    rollout, estimator = config.worker.rollout, config.algorithm.adv_estimator
    greedy = "temperature=0" if rollout.temperature == 0 else "top_k=1" if rollout.top_k == 1 else None
    if greedy and rollout.n > 1 and config.algorithm.estimator("group"):
        raise ConfigError(
            f"worker.rollout.{greedy} samples greedily, so the worker.rollout.n={rollout.n} responses of each prompt "
            f"are identical and every advantage of algorithm.adv_estimator={estimator} (relative to its group) is 0: "
            "nothing would be learned. Sample with worker.rollout.temperature=1.0 (and top_k=-1); keep greedy "
            "decoding for validation (worker.rollout.val_override_config)."
        )


def check_config(config: "PPOConfig") -> None:
    """All value checks of a merged configuration, in the order of the module docstring.

    Raises:
        ConfigError: the first failing check, naming the key(s), the value and the allowed range or choices.
    """
    if not config.worker.actor.model.model_path:
        raise ConfigError("worker.actor.model.model_path is not set: give a hub id or a local model folder.")
    check_fields(config, type(config))
    for section in (config.data, config.algorithm, config.worker.rollout, config.worker, config.trainer):
        section.check()
    config.worker.actor.model.lora.check("worker.actor.model.lora")
    check_divisibility(config)
    check_names(config)
    check_combinations(config)
    check_greedy_groups(config)
    check_multi_turn(config.worker.rollout.multi_turn)
    check_judge(config.worker.reward.judge, config.worker.rollout.tensor_parallel_size)
    check_reward_model(config)
    check_distillation(config)
    check_rollout_mode(config)
