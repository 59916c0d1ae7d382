"""Checks of a finalized configuration's values that span sections, before anything is loaded or started. A value's
type, range or choice is on its field (checked while loading, so that a zero never reaches a division), a section's
own rules in its ``check`` method. Each failure raises :class:`easyrl.errors.ConfigError` naming the key, the value
and what to set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from easyrl.config.judge import check_judge
from easyrl.config.multi_turn import check_multi_turn
from easyrl.config.reward_model import check_reward_model
from easyrl.config.split import check_rollout_mode
from easyrl.config.teacher import check_distillation
from easyrl.errors import ConfigError

if TYPE_CHECKING:
    from easyrl.config.ppo import PPOConfig


def check_tensor_parallel(world_size: int, tensor_parallel_size: int) -> None:
    """Raise unless ``tensor_parallel_size`` (>= 1) divides ``world_size`` (the rollout's vLLM engines each span
    ``tensor_parallel_size`` devices; see ``easyrl.workers.rollout_layout``).

    Raises:
        ConfigError: naming ``worker.rollout.tensor_parallel_size``, the device count and the sizes that would fit.
    """
    if tensor_parallel_size < 1 or world_size % tensor_parallel_size != 0:
        fits = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ConfigError(
            f"worker.rollout.tensor_parallel_size={tensor_parallel_size} does not divide the {world_size} devices "
            f"(trainer.nnodes * trainer.n_gpus_per_node): each vLLM engine spans tensor_parallel_size devices, so "
            f"choose one of {', '.join(map(str, fits))}."
        )


def check_divisibility(config: "PPOConfig") -> None:
    """Batch sizes that must split evenly: rollout batch into mini-batches, mini-batch samples over the devices, a
    device's share into micro-batches (batch sizes in prompts, micro-batches in samples),
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
    check_tensor_parallel(config.world_size, config.worker.rollout.tensor_parallel_size)


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


def check_combinations(config: "PPOConfig") -> None:
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
    for section in (config.data, config.algorithm, config.worker.actor, config.worker.rollout, config.worker,
                    config.trainer):
        section.check()
    check_divisibility(config)
    check_combinations(config)
    check_greedy_groups(config)
    check_multi_turn(config.worker.rollout.multi_turn)
    check_judge(config.worker.reward.judge, config.worker.rollout.tensor_parallel_size)
    check_reward_model(config)
    check_distillation(config)
    check_rollout_mode(config)
