"""Checks of a merged configuration's values, before anything is loaded or started (called by ``load_config`` once
``PPOConfig.finalize`` has filled in the auto keys).

Order matters for the messages: every size is checked to be in range first (so that a zero never reaches a
division), then the sizes that must divide each other, then names chosen from a list, then settings that only make
sense together. Each failure raises :class:`easyrl.errors.ConfigError` naming the key, the value and what to set.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from typing import TYPE_CHECKING, Any, Callable

from easyrl.config.judge import check_judge
from easyrl.config.multi_turn import check_multi_turn
from easyrl.config.reward_model import check_reward_model
from easyrl.config.teacher import check_distillation
from easyrl.config.trainer import check_backends
from easyrl.errors import ConfigError

if TYPE_CHECKING:
    from easyrl.config.ppo import PPOConfig

RESUME_MODES = ("auto", "disable", "force", "resume_path")

# (rule, keys): each rule is (test, the allowed range in words). None values are skipped (they mean "off").
_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "positive": (lambda v: v > 0, "a positive number"),
    "non_negative": (lambda v: v >= 0, "0 or more"),
    "positive_or_-1": (lambda v: v > 0 or v == -1, "a positive number, or -1"),
    "at_least_-1": (lambda v: v >= -1, "-1 (off), 0 (off) or a positive number"),
    "fraction": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "unit": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "below_1": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "above_1": (lambda v: v > 1, "greater than 1"),
}
RANGE_RULES: dict[str, tuple[str, ...]] = {
    "positive": (
        "data.max_prompt_length", "data.max_response_length", "data.rollout_batch_size", "data.min_pixels",
        "data.max_pixels", "worker.actor.global_batch_size", "worker.actor.micro_batch_size_per_device_for_update",
        "worker.actor.micro_batch_size_per_device_for_experience", "worker.actor.ppo_epochs", "worker.rollout.n",
        "worker.rollout.max_num_batched_tokens", "trainer.total_epochs", "trainer.max_steps", "trainer.nnodes",
        "trainer.n_gpus_per_node", "worker.actor.max_grad_norm", "worker.actor.tis_cap",
        "worker.rollout.cpu_kvcache_space_gib", "algorithm.kl_target", "algorithm.kl_horizon",
        "worker.actor.max_token_len_per_device", "trainer.cpu_threads_per_worker",
        "worker.rollout.update_weights_bucket_megabytes", "worker.nccl_timeout",
        "worker.actor.tau_positive", "worker.actor.tau_negative", "worker.actor.model.lora.alpha",
        "worker.critic.global_batch_size",
        "worker.critic.micro_batch_size_per_device_for_update",
        "worker.critic.micro_batch_size_per_device_for_experience",
        "worker.critic.ppo_epochs", "worker.critic.max_grad_norm", "worker.critic.cliprange_value",
        "worker.critic.max_token_len_per_device", "worker.rollout.tensor_parallel_size",
        "worker.actor.clip_cov_ratio", "worker.actor.kl_cov_ratio", "worker.actor.dro_beta",
        "worker.actor.rollout_is_threshold", "worker.actor.rollout_is_threshold_lower",
    ),
    "non_negative": (
        "worker.rollout.limit_images", "worker.rollout.temperature", "worker.actor.optim.lr",
        "worker.actor.optim.weight_decay", "algorithm.kl_coef", "worker.actor.clip_ratio_high",
        "worker.actor.model.lora.rank", "worker.actor.router_aux_loss_coef",
        "trainer.val_generations_to_log",
        "worker.critic.optim.lr", "worker.critic.optim.weight_decay", "trainer.critic_warmup",
        "worker.actor.ppo_kl_coef",
    ),
    "positive_or_-1": ("data.val_batch_size", "trainer.val_freq", "algorithm.max_try_make_batch"),
    "at_least_-1": ("worker.rollout.top_k",),
    "fraction": ("worker.rollout.top_p", "worker.rollout.gpu_memory_utilization"),
    # clip_ratio_low = 1: no lower bound on the ratio (CISPO's paper setting; the ratio itself is > 0)
    "unit": ("worker.actor.optim.lr_warmup_ratio", "algorithm.gamma", "algorithm.filter_low", "algorithm.filter_high",
             "worker.actor.clip_ratio_low", "algorithm.lam", "worker.critic.optim.lr_warmup_ratio"),
    "above_1": ("worker.actor.clip_ratio_dual",),  # dual-clip PPO's c > 1 (Ye et al. 2020, Eq. 5)
}
# Sampling settings that worker.rollout.val_override_config may replace during validation (see workers/rollout.py).
VAL_OVERRIDE_RULES = {"n": "positive", "temperature": "non_negative", "top_p": "fraction", "top_k": "at_least_-1"}


def get_dotted(config: Any, key: str) -> Any:
    """``config.a.b.c`` for ``key="a.b.c"``."""
    for part in key.split("."):
        config = getattr(config, part)
    return config


def check_range(key: str, value: Any, rule: str) -> None:
    """Raise ``ConfigError`` unless ``value`` (a number, or None = unset) satisfies ``RANGE_RULES``' ``rule``."""
    if value is None:
        return
    test, words = _RANGES[rule]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not test(value):
        raise ConfigError(f"{key} must be {words}, got {value!r}.")


def check_choice(key: str, value: Any, choices: Any) -> None:
    """Raise ``ConfigError`` unless ``value`` is one of ``choices`` (the message lists them)."""
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(map(str, choices))}.")


def check_ranges(config: "PPOConfig") -> None:
    """Every numeric setting in its range (see ``RANGE_RULES``), and ``val_override_config``'s keys and values."""
    for rule, keys in RANGE_RULES.items():
        for key in keys:
            check_range(key, get_dotted(config, key), rule)
    for section in ("actor", "critic"):
        for i, beta in enumerate(get_dotted(config, f"worker.{section}.optim.betas")):
            check_range(f"worker.{section}.optim.betas[{i}]", beta, "below_1")
    if config.data.min_pixels > config.data.max_pixels:
        raise ConfigError(f"data.min_pixels ({config.data.min_pixels}) is larger than data.max_pixels "
                          f"({config.data.max_pixels}).")
    if config.algorithm.filter_low > config.algorithm.filter_high:
        raise ConfigError(f"algorithm.filter_low ({config.algorithm.filter_low}) is larger than "
                          f"algorithm.filter_high ({config.algorithm.filter_high}).")
    for name, value in config.worker.rollout.val_override_config.items():
        key = f"worker.rollout.val_override_config.{name}"
        if name not in VAL_OVERRIDE_RULES:
            close = difflib.get_close_matches(str(name), list(VAL_OVERRIDE_RULES), n=1, cutoff=0.6)
            raise ConfigError(
                f"Unknown key '{key}'." + (f" Did you mean: {close[0]}?" if close else "")
                + f" Validation can override: {', '.join(VAL_OVERRIDE_RULES)}."
            )
        check_range(key, value, VAL_OVERRIDE_RULES[name])


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
    for the actor and, with ``algorithm.adv_estimator: gae``, the critic; and the devices into vLLM engines of
    ``worker.rollout.tensor_parallel_size``."""
    sections = [("worker.actor", config.worker.actor)]
    if config.algorithm.needs_critic:
        sections.append(("worker.critic", config.worker.critic))
    for section, cfg in sections:
        _check_batch_split(config, section, cfg.global_batch_size, cfg.micro_batch_size_per_device_for_update)
    try:
        check_tensor_parallel(config.world_size, config.worker.rollout.tensor_parallel_size)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _check_batch_split(config: "PPOConfig", section: str, global_batch_size: int, micro_batch_size: int) -> None:
    if config.data.rollout_batch_size % global_batch_size != 0:
        raise ConfigError(
            f"data.rollout_batch_size ({config.data.rollout_batch_size}) must be a multiple of "
            f"{section}.global_batch_size ({global_batch_size})."
        )
    samples_per_minibatch = global_batch_size * config.worker.rollout.n
    if samples_per_minibatch % config.world_size != 0:
        raise ConfigError(
            f"{section}.global_batch_size * worker.rollout.n ({samples_per_minibatch}) samples must split "
            f"evenly over {config.world_size} devices (trainer.nnodes * trainer.n_gpus_per_node)."
        )
    per_device = samples_per_minibatch // config.world_size
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
    check_choice("algorithm.kl_type", config.algorithm.kl_type, ("fixed", "adaptive"))
    check_choice("worker.actor.loss_type", actor.loss_type, list(POLICY_LOSSES))
    check_choice("worker.actor.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES)
    check_choice("worker.critic.loss_agg_mode", config.worker.critic.loss_agg_mode, LOSS_AGG_MODES)
    for key in ("param_dtype", "reduce_dtype"):
        for section in ("actor", "critic"):
            check_choice(f"worker.{section}.fsdp.{key}", get_dotted(config, f"worker.{section}.fsdp.{key}"),
                         ("bf16", "fp16", "fp32"))
    check_choice("worker.rollout.dtype", config.worker.rollout.dtype, ("bf16", "fp16", "fp32"))
    check_choice("worker.reward.reward_type", config.worker.reward.reward_type, ("auto", "batch", "sequential"))
    check_choice("trainer.device", config.trainer.device, ("auto", "cuda", "npu", "cpu"))
    check_choice("trainer.best_metric_mode", config.trainer.best_metric_mode, ("max", "min"))
    check_choice("trainer.resume_mode", config.trainer.resume_mode, RESUME_MODES)
    check_choice("worker.reward.on_error", config.worker.reward.on_error, ("raise", "zero"))
    check_backends(config.trainer.logger)  # known names, and their libraries installed


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
        budget = role.max_token_len_per_device
        if role.dynamic_batching and budget is not None and budget < longest:
            raise ConfigError(
                f"worker.{section}.max_token_len_per_device={budget} is below the longest sample, "
                f"data.max_prompt_length + data.max_response_length = {longest}: raise it (or leave it null)."
            )
    if algo.needs_critic and config.worker.critic.model.lora.rank > 0:
        raise ConfigError("worker.critic.model.lora.rank must be 0: the critic (algorithm.adv_estimator=gae) trains "
                          "all its weights (LoRA applies to the actor only, worker.actor.model.lora).")
    if config.trainer.val_only and not config.data.val_files:
        raise ConfigError("trainer.val_only=true validates on data.val_files, which is not set: give "
                          "data.val_files=PATH (the validation set; easyrl eval needs it too).")
    if config.trainer.resume_mode == "resume_path" and not config.trainer.load_checkpoint_path:
        raise ConfigError("trainer.resume_mode=resume_path resumes trainer.load_checkpoint_path, which is not set: "
                          "give it a global_step_N folder, or use resume_mode=auto.")
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


def check_lora(lora: Any) -> None:
    """``worker.actor.model.lora`` (when ``rank > 0``): some module names to target, and an exclude pattern that is a
    valid regular expression (peft matches it against full module names)."""
    if lora.rank == 0:
        return
    if not str(lora.target_modules).strip(" ,"):
        raise ConfigError("worker.actor.model.lora.target_modules is empty: give 'all-linear' or comma-separated "
                          "module names (q_proj,k_proj,v_proj,o_proj).")
    if lora.exclude_modules:
        try:
            re.compile(lora.exclude_modules)
        except re.error as err:
            raise ConfigError(f"worker.actor.model.lora.exclude_modules={lora.exclude_modules!r} is not a regular "
                              f"expression ({err}); e.g. '.*visual.*' leaves the vision tower without adapter.") from None


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env_vars(env_vars: dict) -> None:
    """``worker.env_vars``: every name a valid environment variable name (letters, digits, ``_``; not starting with
    a digit). Values are strings by the field's type (OmegaConf refuses lists, mappings and null)."""
    for name in env_vars:
        if not ENV_NAME.match(str(name)):
            raise ConfigError(f"worker.env_vars has the name {name!r}, which is not an environment variable name "
                              "(letters, digits and _, not starting with a digit).")


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


def check_run_names(trainer: Any) -> None:
    """``trainer.project_name`` and ``trainer.experiment_name`` are each one folder name, so that the run folder
    ``<runs_root>/<project_name>/<experiment_name>`` stays inside ``trainer.runs_root``: not empty, no ``/`` or
    ``\\``, not ``.`` or ``..``."""
    for key in ("project_name", "experiment_name"):
        name = getattr(trainer, key)
        if not name.strip():
            raise ConfigError(f"trainer.{key} is empty: give a folder name for the run, e.g. trainer.{key}=my_run.")
        if "/" in name or "\\" in name or name.strip() in (".", ".."):
            safe = re.sub(r"[/\\]+", "_", name).strip("._") or "my_run"
            folder = os.path.normpath(os.path.join(trainer.runs_root, trainer.project_name, trainer.experiment_name))
            raise ConfigError(
                f"trainer.{key}={name!r} is not one folder name: the run folder would be {folder!r}, not "
                f"<runs_root>/<project_name>/<experiment_name> inside trainer.runs_root={trainer.runs_root!r}. Write a "
                f"name without '/', '\\' or '..', e.g. trainer.{key}={safe}, and choose where runs go with "
                "trainer.runs_root."
            )


def check_config(config: "PPOConfig") -> None:
    """All value checks of a merged configuration, in the order of the module docstring.

    Raises:
        ConfigError: the first failing check, naming the key(s), the value and the allowed range or choices.
    """
    if not config.worker.actor.model.model_path:
        raise ConfigError("worker.actor.model.model_path is not set: give a hub id or a local model folder.")
    check_ranges(config)
    check_divisibility(config)
    check_names(config)
    check_combinations(config)
    check_lora(config.worker.actor.model.lora)
    check_env_vars(config.worker.env_vars)
    check_run_names(config.trainer)
    check_greedy_groups(config)
    check_easyr1_keys(config)
    check_multi_turn(config.worker.rollout.multi_turn)
    check_judge(config.worker.reward.judge, config.worker.rollout.tensor_parallel_size, check_range)
    check_reward_model(config)
    check_distillation(config)


def check_easyr1_keys(config: "PPOConfig") -> None:
    """The keys taken from EasyR1's schema (docs/migrating.md): optimizer strategy, LR schedule, stored dtype, and
    the generation batch (``data.mini_rollout_batch_size``), whose samples must split over the devices."""
    for section in ("actor", "critic"):
        role = getattr(config.worker, section)
        check_choice(f"worker.{section}.optim.strategy", role.optim.strategy, ("adamw", "adamw_bf16"))
        check_choice(f"worker.{section}.optim.lr_scheduler_type", role.optim.lr_scheduler_type, ("constant", "cosine"))
        check_choice(f"worker.{section}.fsdp.torch_dtype", role.fsdp.torch_dtype, (None, "bf16", "fp16", "fp32"))
        check_range(f"worker.{section}.optim.lr_warmup_steps", role.optim.lr_warmup_steps, "non_negative")
        check_range(f"worker.{section}.optim.min_lr_ratio", role.optim.min_lr_ratio, "unit")
    mini = config.data.mini_rollout_batch_size
    check_range("data.mini_rollout_batch_size", mini, "positive")
    if mini is not None and mini * config.worker.rollout.n % config.world_size != 0:
        raise ConfigError(
            f"data.mini_rollout_batch_size * worker.rollout.n ({mini * config.worker.rollout.n}) samples must split "
            f"evenly over {config.world_size} devices (trainer.nnodes * trainer.n_gpus_per_node)."
        )
