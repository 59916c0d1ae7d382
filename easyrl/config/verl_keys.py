"""verl's config keys that easyrl does not read, each with the easyrl key that does its job or why there is none: the
hint of an unknown-key error (``easyrl.config.loading``), so that a verl user learns where the setting went. The keys
are verl's (its ``ppo_trainer`` config and its one-step-off and fully async recipes, ``verl/experimental/``); the
same mapping is the verl table of docs/migrating.md (``tests/test_verl_keys.py`` checks that both list each key).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["VERL_KEYS", "VERL_SECTIONS", "verl_hints"]

_SPLIT = "trainer.rollout_mode=one_step_off or async with worker.rollout.n_gpus_per_node (docs/async.md)"

VERL_KEYS: dict[str, str] = {
    "actor_rollout_ref.hybrid_engine": "trainer.rollout_mode: colocated (the default) for true; for false, "
                                       + _SPLIT,
    "actor_rollout_ref.rollout.mode": "none: verl's sync/async picks its engine API (LLM or AsyncLLM); easyrl always "
                                      "drives vLLM request by request. Rollout while training is " + _SPLIT,
    "rollout.n_gpus_per_node": "worker.rollout.n_gpus_per_node (devices per node of the rollout engines)",
    "rollout.nnodes": "none: the rollout engines use trainer.nnodes nodes, worker.rollout.n_gpus_per_node devices "
                      "on each",
    "rollout.n": "worker.rollout.n",
    "rollout.total_rollout_steps": "trainer.max_steps (easyrl counts training steps of data.rollout_batch_size "
                                   "prompts, not samples)",
    "rollout.total_epochs": "trainer.total_epochs",
    "rollout.test_freq": "trainer.val_freq",
    "async_training.staleness_threshold": "trainer.max_staleness with trainer.rollout_mode=async: a whole number of "
                                          "weight versions, not verl's fraction of extra samples",
    "async_training.trigger_parameter_sync_step": "none: the weights go to the engines after every training step, "
                                                  "which updates data.rollout_batch_size / worker.actor."
                                                  "global_batch_size times",
    "async_training.require_batches": "none: each training step takes data.rollout_batch_size prompt groups "
                                      "(generated in chunks of data.mini_rollout_batch_size)",
    "async_training.partial_rollout": "none: trainer.rollout_mode=async always keeps the requests in flight across "
                                      "a weight update (partial rollouts, docs/async.md)",
    "async_training.use_rollout_log_probs": "algorithm.bypass_mode (vLLM's log-probs as the old policy's)",
    "async_training.compute_prox_log_prob": "none: the old-log-prob pass (the proximal policy) runs unless "
                                            "algorithm.bypass_mode=true",
    "async_training.use_trainer_do_validate": "none: validation runs on the rollout engines (trainer.val_freq)",
    "async_training.checkpoint_engine": "none: the weights cross by easyrl's own transfer group "
                                        "(easyrl.workers.weight_transfer); its bucket size is "
                                        "worker.rollout.update_weights_bucket_megabytes",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes":
        "worker.rollout.update_weights_bucket_megabytes",
    "actor_rollout_ref.rollout.free_cache_engine": "none: colocated engines always free their KV cache (sleep) "
                                                   "between rollouts; engines of their own keep it",
    "algorithm.rollout_correction.bypass_mode": "algorithm.bypass_mode",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "worker.actor.ulysses_size",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": "none: the reference runs with worker.actor.ulysses_size",
    "critic.ulysses_sequence_parallel_size": "none: the critic runs with worker.actor.ulysses_size",
}
"""verl key -> the easyrl key (with the value, where it differs), or ``none: why``."""
VERL_SECTIONS = ("actor_rollout_ref", "async_training", "critic", "custom_reward_function", "reward_model", "rollout")
"""verl's top-level sections that easyrl has not: another key under one is answered with docs/migrating.md."""


def section_hint(rest: list[str]) -> str:
    """The hint for keys ``rest`` of a verl section that :data:`VERL_KEYS` does not list."""
    keys = f"{rest[0]}, a key" if len(rest) == 1 else f"{len(rest)} keys (e.g. {rest[0]})"
    what = "it is" if len(rest) == 1 else "each is"
    return f"{keys} of verl's config: docs/migrating.md, From verl, says what {what} in easyrl"


def verl_hints(name: str, value: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """``(verl key, what to write in easyrl)`` for each key of :data:`VERL_KEYS` at or under the unknown key ``name``
    whose (possibly nested) value is ``value`` (a key that is a section in verl, ``async_training.checkpoint_engine``,
    covers its keys), and the dotted keys of ``value`` that none of them covers."""
    found: list[tuple[str, str]] = []
    rest: list[str] = []

    def walk(key: str, node: Any) -> None:
        hint: Optional[str] = VERL_KEYS.get(key)
        if hint is not None:
            none = hint.startswith("none: ")
            found.append((key, f"verl's key; easyrl has {'none: ' + hint[6:] if none else 'it as ' + hint}"))
        elif isinstance(node, dict) and node:
            for sub, child in node.items():
                walk(f"{key}.{sub}", child)
        else:
            rest.append(key)

    walk(name, value)
    return found, rest
