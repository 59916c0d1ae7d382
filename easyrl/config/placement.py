"""``trainer.rollout_mode``: where the rollout engines run and how far ahead of the training they generate
(``Placement``, decided once here; the trainer holds the parts it chooses), and what a split placement (rollout engines
on devices of their own) needs, checked before anything starts (docs/async.md)."""

from __future__ import annotations

from dataclasses import dataclass

from easyrl.errors import ConfigError


@dataclass(frozen=True)
class Placement:
    """The rollout's placement and batch source, from ``trainer.rollout_mode``."""

    split: bool
    """The engines run on devices of their own (``worker.rollout.n_gpus_per_node`` per node) and generate ahead of
    the training (``easyrl.trainer.async_rollout``); else they share the trainer's devices and generate each step's
    batch when the step starts."""
    max_staleness: int
    """The largest version gap (training steps between the weights that sampled a sample and those it trains) of a
    trained sample: 0 colocated, 1 one step off, ``trainer.max_staleness`` async."""
    chunk_groups: int
    """The prompt groups of one generation call ahead: ``data.rollout_batch_size`` one step off (a whole batch),
    ``data.generation_batch_size`` async (``data.mini_rollout_batch_size`` when set)."""
    engine_devices: int
    """The split engines' devices, ``trainer.nnodes x worker.rollout.n_gpus_per_node`` (0 colocated)."""


def placement_of(config) -> Placement:
    """The ``Placement`` that ``config.trainer.rollout_mode`` names (``config``: a ``PPOConfig``)."""
    mode, data = config.trainer.rollout_mode, config.data
    if mode == "colocated":
        return Placement(False, 0, data.rollout_batch_size, 0)
    devices = config.trainer.nnodes * (config.worker.rollout.n_gpus_per_node or 0)
    if mode == "one_step_off":
        return Placement(True, 1, data.rollout_batch_size, devices)
    return Placement(True, config.trainer.max_staleness, data.generation_batch_size, devices)


def check_rollout_mode(config) -> None:
    """``config`` (a ``PPOConfig``): a split ``trainer.rollout_mode`` (``one_step_off``, ``async``) has rollout devices
    (``worker.rollout.n_gpus_per_node``, split evenly into engines; ``async``: generation rounds that fill a batch) and
    multi-turn trajectories scheduled by request; ``colocated`` has no rollout devices of its own. ``ConfigError``
    naming the key and what to set."""
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
    tp = rollout.tensor_parallel_size
    if rollout.n_gpus_per_node % tp:
        raise ConfigError(f"worker.rollout.tensor_parallel_size={tp} must divide worker.rollout.n_gpus_per_node="
                          f"{rollout.n_gpus_per_node} ({key}: the engines span the rollout devices).")
    if mode == "async" and config.data.rollout_batch_size % config.data.generation_batch_size:
        raise ConfigError(f"data.mini_rollout_batch_size={config.data.mini_rollout_batch_size} must divide "
                          f"data.rollout_batch_size={config.data.rollout_batch_size} ({key}: a step trains whole "
                          "generation rounds, each tagged with the weights that sampled it).")
    if rollout.multi_turn.enable and rollout.multi_turn.patience is not None:
        raise ConfigError(f"worker.rollout.multi_turn.patience={rollout.multi_turn.patience} schedules the turns in "
                          f"rounds, each a whole batch on the engines, which {key} cannot run beside the requests it "
                          "keeps in flight there: set worker.rollout.multi_turn.patience=null (each trajectory's "
                          "turns by request), or trainer.rollout_mode=colocated.")
