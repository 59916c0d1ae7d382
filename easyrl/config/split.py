"""``trainer.rollout_mode``: what a split-placement mode (rollout engines on devices of their own) needs and what it
does not run yet, checked before anything starts (docs/async.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from easyrl.errors import ConfigError

if TYPE_CHECKING:
    from easyrl.config.ppo import PPOConfig


def check_rollout_mode(config: "PPOConfig") -> None:
    """A split ``trainer.rollout_mode`` (``one_step_off``, ``async``) has rollout devices
    (``worker.rollout.n_gpus_per_node``, split evenly into engines that take a generation round's samples evenly;
    ``async``: rounds that fill a batch), and none of the features the split placement does not run yet;
    ``colocated`` has no rollout devices of its own. ``ConfigError`` naming the key and what to set."""
    mode, rollout, trainer = config.trainer.rollout_mode, config.worker.rollout, config.trainer
    if mode != "async" and trainer.max_staleness != 1:
        raise ConfigError(f"trainer.max_staleness={trainer.max_staleness} bounds the version gap of "
                          f"trainer.rollout_mode=async only (rollout_mode={mode} trains samples at most "
                          f"{'0' if mode == 'colocated' else '1'} version old): set trainer.rollout_mode=async, or "
                          "drop trainer.max_staleness.")
    if mode == "colocated":
        if rollout.n_gpus_per_node is not None:
            raise ConfigError(f"worker.rollout.n_gpus_per_node={rollout.n_gpus_per_node} places the rollout engines "
                              "on devices of their own, which only trainer.rollout_mode=one_step_off or async does: "
                              "set it, or worker.rollout.n_gpus_per_node=null (colocated engines share the trainer's "
                              "devices).")
        return
    key = f"trainer.rollout_mode={mode}"
    if rollout.n_gpus_per_node is None:
        raise ConfigError(f"{key} runs the rollout engines on devices of their own: set worker.rollout.n_gpus_per_node "
                          "(e.g. 1; the trainer keeps trainer.n_gpus_per_node).")
    devices, tp = trainer.nnodes * rollout.n_gpus_per_node, rollout.tensor_parallel_size
    if rollout.n_gpus_per_node % tp:
        raise ConfigError(f"worker.rollout.tensor_parallel_size={tp} must divide worker.rollout.n_gpus_per_node="
                          f"{rollout.n_gpus_per_node} ({key}: the engines span the rollout devices).")
    samples = config.data.generation_batch_size * rollout.n
    if samples % (devices // tp):
        raise ConfigError(f"a generation round's {samples} samples (data.mini_rollout_batch_size or "
                          f"rollout_batch_size x worker.rollout.n) must split evenly over the {devices // tp} rollout "
                          f"engines ({key}: trainer.nnodes x worker.rollout.n_gpus_per_node / tensor_parallel_size).")
    if mode == "async" and config.data.rollout_batch_size % config.data.generation_batch_size:
        raise ConfigError(f"data.mini_rollout_batch_size={config.data.mini_rollout_batch_size} must divide "
                          f"data.rollout_batch_size={config.data.rollout_batch_size} ({key}: a step trains whole "
                          "generation rounds, each tagged with the weights that sampled it).")
    validates = config.data.val_files and (trainer.val_freq > 0 or trainer.val_before_train or trainer.val_only)
    not_built = {
        "worker.rollout.multi_turn.enable=true": rollout.multi_turn.enable,
        "worker.reward.judge.model_path": config.worker.reward.judge.model_path is not None,
        "worker.reward.reward_model.model_path": config.worker.reward.reward_model.enabled,
        f"algorithm.adv_estimator={config.algorithm.adv_estimator} (a distillation teacher)":
            config.algorithm.needs_teacher,
        "worker.actor.model.lora.rank > 0": config.uses_lora,
        "validation (trainer.val_freq, val_before_train, val_only with data.val_files)": validates,
    }
    for what, used in not_built.items():
        if used:
            raise ConfigError(f"{key} does not support {what} yet (docs/async.md, 'Not built yet'): turn it off, or "
                              "use trainer.rollout_mode=colocated.")

