"""Which config keys change what a run trains (all but ``NEUTRAL_KEYS``; a key added later does by default), and the
differences in them between a run folder's saved config and a new one: a resumed run must train the same way as the
run it continues (``easyrl.trainer.run_folder``; docs/config.md, "Running again")."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

# dotted keys (fnmatch patterns) whose change leaves the training the same
NEUTRAL_KEYS: tuple[str, ...] = (
    # the run's names, outputs, logging, resume switches, length
    "trainer.project_name", "trainer.experiment_name", "trainer.runs_root", "trainer.run_dir", "trainer.logger",
    "trainer.wandb_*", "trainer.save_*", "trainer.load_checkpoint_path", "trainer.find_last_checkpoint",
    "trainer.rollout_data_dir", "trainer.rollout_data_limit",
    "trainer.resume_mode", "trainer.best_metric*", "trainer.total_epochs", "trainer.max_steps",
    # validation
    "trainer.val_*", "data.val_files", "data.val_batch_size", "worker.rollout.val_override_config*",
    # devices, memory and speed
    "trainer.device", "trainer.cpu_threads_per_worker", "worker.*.micro_batch_size_per_device_for_*",
    "worker.*.max_token_len_per_device", "worker.*.padding_free", "worker.*.dynamic_batching", "worker.*.offload*",
    "worker.*.fsdp.enable_gradient_checkpointing", "worker.*.fsdp.reshard_after_forward",
    "worker.rollout.gpu_memory_utilization", "worker.rollout.cpu_kvcache_space_gib",
    "worker.rollout.update_weights_bucket_megabytes", "worker.rollout.enforce_eager",
    "worker.rollout.enable_chunked_prefill", "worker.rollout.max_num_batched_tokens", "worker.rollout.disable_tqdm",
    "worker.nccl_timeout", "worker.env_vars*", "worker.reward.timeout_s", "trainer.check_collectives",
    "worker.reward.reward_model.micro_batch_size_per_device",
    "worker.rollout.limit_videos",  # vLLM's per-prompt capacity, raised from the data at start-up
    "worker.rollout.multi_turn.patience",  # which round a turn rides in, not what it samples (agents/scheduler.py)
    "worker.actor.ulysses_size",  # how a sequence is split over a group's devices, not what a step trains
)


def alters_training(key: str) -> bool:
    """Whether a change of dotted config key ``key`` (e.g. ``worker.actor.optim.lr``) changes what is trained: every
    key but those matching ``NEUTRAL_KEYS`` (a key inside a free-form dict, such as
    ``worker.reward.reward_function_kwargs.format_weight``, counts as its dict)."""
    return not any(fnmatchcase(key, pattern) for pattern in NEUTRAL_KEYS)


def flatten(tree: dict[str, Any], whole: frozenset[str] = frozenset(), prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{dotted key: leaf value}``; the keys in ``whole`` (free-form dicts) stay one value each.
    Tuples read as lists, as a YAML round trip gives them."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name not in whole:
            flat.update(flatten(value, whole, name + "."))
        else:
            flat[name] = list(value) if isinstance(value, tuple) else value
    return flat


def training_changes(old: dict[str, Any], new: dict[str, Any],
                     free_dicts: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """``[(dotted key, old value, new value)]`` of the keys that change training (:func:`alters_training`) and differ
    between the saved nested config ``old`` and ``new``, in ``new``'s key order; ``free_dicts`` (dotted keys of
    free-form dicts) are compared whole, a key only one of the two has is not compared."""
    whole = frozenset(free_dicts)
    flat_old, flat_new = flatten(old, whole), flatten(new, whole)
    return [(key, flat_old[key], value) for key, value in flat_new.items()
            if key in flat_old and alters_training(key) and flat_old[key] != value]
