"""``trainer.rollout_mode``: where the rollout engines run and how far ahead of the training they generate
(``Placement``, decided once here; the trainer holds the parts it chooses), whether there are engines at all (a replay
of a rollout dump, ``trainer.load_rollout_data_dir``, has none: docs/replay.md), and what a split placement (rollout
engines on devices of their own) and a replay need, checked before anything starts (docs/async.md)."""

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
    """The split engines' devices, ``trainer.nnodes x worker.rollout.n_gpus_per_node`` (0 colocated or replayed)."""
    engines: bool = True
    """Rollout engines are built. False for a replay (``trainer.load_rollout_data_dir``): the trainer's workers hold
    the model roles alone, each step's batch is read from the dump, scored (its judge and reward-model scores
    included), and ``max_staleness`` is that of the dumped run's ``trainer.rollout_mode``."""


def placement_of(config) -> Placement:
    """The ``Placement`` that ``config.trainer.rollout_mode`` names, or a replay's (``trainer.load_rollout_data_dir``
    set: no engines; ``config``: a ``PPOConfig``)."""
    mode, data = config.trainer.rollout_mode, config.data
    if config.trainer.load_rollout_data_dir is not None:  # a replay: the samples' staleness is the dumped run's
        staleness = {"colocated": 0, "one_step_off": 1}.get(mode, config.trainer.max_staleness)
        return Placement(False, staleness, data.rollout_batch_size, 0, engines=False)
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


def check_replay(config) -> None:
    """``config`` (a ``PPOConfig``) replaying a dump (``trainer.load_rollout_data_dir``) asks for no validation, which
    needs the engines a replay does not build. ``ConfigError`` naming the keys to set."""
    trainer = config.trainer
    if trainer.load_rollout_data_dir is None:
        return
    asked = [f"trainer.{key}=true" for key in ("val_only",) if trainer.val_only]
    if config.data.val_files:
        asked += ["trainer.val_before_train=true"] * trainer.val_before_train
        asked += [f"trainer.val_freq={trainer.val_freq}"] * (trainer.val_freq > 0)
    if asked:
        raise ConfigError(f"trainer.load_rollout_data_dir={trainer.load_rollout_data_dir} replays a dump without "
                          f"rollout engines, which validation needs ({', '.join(asked)}): set data.val_files=null "
                          "(or trainer.val_before_train=false and trainer.val_freq=-1), and validate the result "
                          "apart (easyrl eval).")
