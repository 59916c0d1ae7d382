"""EasyR1's config keys that easyrl names or places differently, mapped at load (``apply_aliases``), so that EasyR1's
``examples/config.yaml`` and launch scripts load unchanged (docs/migrating.md).

Each mapping logs one INFO line on the ``easyrl.config`` logger saying what the key became; a value easyrl cannot
honour yet is refused with a ``ConfigError`` that says what to write instead. Keys EasyR1 and easyrl share with one
meaning are fields of the dataclasses and need no entry here. ``get_key``/``set_key``/``pop_key`` address a nested
dict by dotted key (also for ``easyrl.config.loading`` and ``paths``).
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Optional

from easyrl.errors import ConfigError

__all__ = ["ALIASES", "MISSING", "apply_aliases", "get_key", "pop_key", "set_key"]

logger = logging.getLogger("easyrl.config")

MISSING = object()
TRAINED = ("actor", "critic")
ROLES = ("actor", "critic", "ref")


def _parent(tree: dict, key: str, create: bool = False) -> tuple[Optional[dict], str]:
    """The mapping that holds ``key``'s last part (made on the way when ``create``; None when absent), and that part."""
    *sections, last = key.split(".")
    node: Any = tree
    for section in sections:
        if create:
            node = node.setdefault(section, {})
        elif isinstance(node, dict):
            node = node.get(section)
    return (node if isinstance(node, dict) else None), last


def get_key(tree: dict, key: str) -> Any:
    """The value of dotted ``key`` in the nested dict ``tree``, or ``MISSING``."""
    node, last = _parent(tree, key)
    return node.get(last, MISSING) if node is not None else MISSING


def pop_key(tree: dict, key: str) -> Any:
    """Remove ``key`` and return its value; the sections it leaves empty go too (e.g. ``worker.ref.fsdp``)."""
    node, last = _parent(tree, key)
    value = node.pop(last)
    if not node and "." in key:
        pop_key(tree, key.rsplit(".", 1)[0])
    return value


def set_key(tree: dict, key: str, value: Any) -> None:
    node, last = _parent(tree, key, create=True)
    node[last] = value


# A rule: (tree, EasyR1 key, its value, source) -> None; it rewrites the tree and logs, or raises ConfigError.
Rule = Callable[[dict, str, Any, str], None]


def move(target: str, values: Optional[dict] = None, combine: Optional[Callable[[Any, Any], Any]] = None) -> Rule:
    """The key means ``target`` (values translated by ``values``; when ``target`` is given too in the same layer,
    ``combine(given, mapped)`` decides, else the EasyR1 key wins)."""
    def rule(tree: dict, key: str, value: Any, source: str) -> None:
        new = values.get(value, value) if values is not None and isinstance(value, str) else value
        given = get_key(tree, target)
        note = ""
        if given is not MISSING and combine is not None:
            new, note = combine(given, new), f" (combined with {target}={given!r} given beside it)"
        pop_key(tree, key)
        set_key(tree, target, new)
        logger.info("easyrl: EasyR1 key %s=%r (from %s) -> %s=%r%s", key, value, source, target, new, note)
    return rule


def drop(meaning: str, accepted: Optional[tuple] = None, instead: str = "") -> Rule:
    """The key has no easyrl counterpart because easyrl always does ``meaning``; a value outside ``accepted``
    (None: any) is refused with ``instead``."""
    def rule(tree: dict, key: str, value: Any, source: str) -> None:
        if accepted is not None and value not in accepted:
            raise ConfigError(f"{key}={value!r} (from {source}) is not supported by easyrl: {instead}")
        pop_key(tree, key)
        logger.info("easyrl: EasyR1 key %s=%r (from %s) dropped: %s", key, value, source, meaning)
    return rule


def rename_value(values: dict) -> Rule:
    """The key is easyrl's too, but some of its values have easyrl names."""
    def rule(tree: dict, key: str, value: Any, source: str) -> None:
        if isinstance(value, str) and value in values:
            set_key(tree, key, values[value])
            logger.info("easyrl: EasyR1 value %s=%r (from %s) -> %r", key, value, source, values[value])
    return rule


def _logger_names(tree: dict, key: str, value: Any, source: str) -> None:
    """EasyR1's ``file`` logger (a JSONL file of every step's metrics) is easyrl's ``jsonl``."""
    if isinstance(value, (list, tuple)) and "file" in value:
        names = list(dict.fromkeys("jsonl" if name == "file" else name for name in value))
        set_key(tree, key, names)
        logger.info("easyrl: EasyR1 logger 'file' in %s (from %s) -> jsonl: %s", key, source, names)


def _either(given: Any, mapped: Any) -> Any:
    return bool(given) or bool(mapped)


ALIASES: dict[str, Rule] = {
    "trainer.max_try_make_batch": move("algorithm.max_try_make_batch"),
    "trainer.logger": _logger_names,
    "trainer.ray_timeline": drop("easyrl writes no Ray timeline", (None,), "remove the key"),
    "data.filter_overlong_prompts_workers": drop("easyrl filters over-long prompts in the driver process"),
    "worker.hybrid_engine": drop("easyrl always colocates the actor and vLLM on every device", (True,),
                                 "only the colocated (hybrid) engine exists; remove the key"),
    "worker.rollout.name": drop("easyrl's rollout engine is vLLM", ("vllm",), "only vllm is available"),
    "worker.rollout.ignore_eos": drop("responses end at EOS", (False,), "set it to false"),
    "worker.rollout.max_model_len": drop("vLLM's context is data.max_prompt_length + data.max_response_length",
                                         (None,), "remove it; easyrl sizes the context from the data lengths"),
    "worker.rollout.disable_log_stats": drop("vLLM's periodic stats are off"),
    "worker.reward.num_cpus": drop("the reward function runs in one reward actor (worker.reward.timeout_s "
                                   "guards it)"),
    "worker.actor.loss_type": rename_value({"default": "vanilla"}),
    "worker.actor.use_torch_compile": drop("easyrl does not torch.compile the actor"),
}
for _role in TRAINED:
    _p = f"worker.{_role}"
    ALIASES.update({
        f"{_p}.loss_avg_mode": move(f"{_p}.loss_agg_mode", {"token": "token-mean", "seq": "seq-mean-token-mean"}),
        f"{_p}.strategy": drop("easyrl trains with FSDP2", ("fsdp",), "only fsdp is available"),
        f"{_p}.model.enable_gradient_checkpointing": move(f"{_p}.fsdp.enable_gradient_checkpointing"),
        f"{_p}.model.override_config": drop("the checkpoint's config.json is used as is", ({},),
                                            "overriding the model config is not implemented yet; edit config.json "
                                            "of a local copy of the model instead"),
        f"{_p}.fsdp.enable_cpu_offload": move(f"{_p}.offload.offload_params", combine=_either),
        f"{_p}.fsdp.enable_full_shard": move(f"{_p}.fsdp.reshard_after_forward"),
        f"{_p}.fsdp.mp_param_dtype": move(f"{_p}.fsdp.param_dtype"),
        f"{_p}.fsdp.mp_reduce_dtype": move(f"{_p}.fsdp.reduce_dtype"),
    })
ALIASES.update({
    "worker.actor.ulysses_sequence_parallel_size": move("worker.actor.ulysses_size"),  # verl's name
    "worker.critic.ulysses_size": drop("the critic runs with worker.actor.ulysses_size (one sequence-parallel layout "
                                       "for every role)", (1,), "set worker.actor.ulysses_size instead (it applies "
                                       "to the critic too) and remove this key"),
    "worker.ref.strategy": drop("easyrl shards the reference with FSDP2", ("fsdp",), "only fsdp is available"),
    "worker.ref.fsdp.enable_cpu_offload": move("worker.ref.offload.offload_params", combine=_either),
    "worker.ref.offload.offload_optimizer": drop("the reference has no optimizer"),
})
for _role in ROLES:
    _p = f"worker.{_role}.fsdp"
    ALIASES.update({
        f"{_p}.enable_rank0_init": drop("easyrl always reads the checkpoint on rank 0 and broadcasts it"),
        f"{_p}.use_orig_params": drop("FSDP2 always keeps the original parameters"),
        f"{_p}.fsdp_size": drop("every device shards the model (one FSDP group)", (-1,),
                                "hybrid sharding (fsdp_size) is not implemented; set it to -1"),
        f"{_p}.mp_buffer_dtype": drop("buffers keep the checkpoint's dtype"),
    })
ALIASES.update({
    f"worker.ref.fsdp.{key}": drop("the reference is held and run in worker.actor.fsdp.param_dtype")
    for key in ("torch_dtype", "mp_param_dtype", "mp_reduce_dtype")
})
ALIASES["worker.ref.fsdp.enable_full_shard"] = drop("the reference is fully sharded and resharded after each forward")


def apply_aliases(layer: dict, source: str) -> dict:
    """A copy of one config layer (a YAML file's or the command line's nested mapping) with EasyR1's keys mapped (see
    ``ALIASES``), each logged once; ``ConfigError`` for a value easyrl cannot honour, saying what to write instead."""
    tree = copy.deepcopy(layer)
    for key, rule in ALIASES.items():
        value = get_key(tree, key)
        if value is not MISSING:
            rule(tree, key, value, source)
    return tree
