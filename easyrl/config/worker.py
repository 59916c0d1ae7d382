"""``worker:``: the rollout engine (vLLM), the reward function, and the section that holds every worker part."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from annotated_types import Ge

from easyrl.config.actor import ActorConfig, RefConfig
from easyrl.config.fields import FRACTION, NON_NEGATIVE, POSITIVE, Note, auto, validate
from easyrl.config.judge import JudgeConfig
from easyrl.config.multi_turn import MultiTurnConfig
from easyrl.config.reward_model import RewardModelConfig
from easyrl.config.role import CriticConfig, Dtype
from easyrl.config.teacher import TeacherConfig
from easyrl.errors import ConfigError

VAL_OVERRIDES = ("n", "temperature", "top_p", "top_k")
"""The sampling settings ``worker.rollout.val_override_config`` may replace during validation (workers/rollout.py)."""


@dataclass
class RolloutConfig:
    """The colocated vLLM engine: sampling settings, memory, validation overrides."""

    n: Annotated[int, POSITIVE] = 5
    """Samples per prompt (the GRPO group size)."""
    temperature: Annotated[float, NON_NEGATIVE] = 1.0
    top_p: Annotated[float, FRACTION] = 1.0
    top_k: Annotated[int, Ge(-1), Note("-1 and 0: off")] = -1
    seed: int = 1
    dtype: Dtype = "bf16"
    tensor_parallel_size: Annotated[int, POSITIVE] = 1
    """Devices per vLLM engine (vLLM's tensor parallelism). 1: every device runs its own engine. k > 1:
    groups of k consecutive devices run one engine split over them (vLLM's ``external_launcher`` executor, SPMD), for
    models whose weights do not fit on one device; the batch is split over the ``world / k`` engines. Must divide
    ``trainer.nnodes * trainer.n_gpus_per_node`` (and, to stay within a node, ``trainer.n_gpus_per_node``);
    ``easyrl.workers.rollout_layout``."""
    gpu_memory_utilization: Annotated[float, FRACTION] = 0.6
    """Fraction of device memory vLLM may take (weights + KV cache); ignored on the CPU."""
    cpu_kvcache_space_gib: Annotated[float, POSITIVE] = 1.0
    """KV cache size on the CPU backend (GiB)."""
    update_weights_bucket_megabytes: Annotated[int, POSITIVE] = 1024
    """Weight sync: full-tensor MiB (in ``dtype``) gathered per collective and handed to vLLM at once; larger = fewer
    collectives, more transient device memory."""
    n_gpus_per_node: Optional[Annotated[int, POSITIVE]] = None
    """``trainer.rollout_mode: one_step_off`` only: devices per node of the rollout engines, apart from the trainer's
    ``trainer.n_gpus_per_node`` (verl's ``actor_rollout_ref.rollout.n_gpus_per_node``); null: colocated."""
    enforce_eager: bool = False
    enable_chunked_prefill: bool = False
    max_num_batched_tokens: Annotated[int, POSITIVE] = 8192
    limit_images: Annotated[int, NON_NEGATIVE] = 1
    """Images per prompt at most (vLLM's ``limit_mm_per_prompt``); in a multi-turn rollout the prompt's and the tools'
    images of one conversation (more tool images are dropped and counted, docs/agents.md "Tool images")."""
    calculate_log_probs: bool = True
    """Keep vLLM's sampled-token log-probs (``rollout_log_probs``): the weight-sync check
    (``worker.actor.rollout_sync_threshold``), ``rollout/*`` mismatch metrics, ``worker.actor.tis_cap``."""
    val_override_config: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.6, "n": 1})
    """Sampling settings that replace the above during validation."""
    disable_tqdm: bool = True
    prompt_length: int = auto("data.max_prompt_length", 1024)
    response_length: int = auto("data.max_response_length", 1024)
    trust_remote_code: bool = auto("worker.actor.model.trust_remote_code", False)
    min_pixels: int = auto("data.min_pixels", 262144)
    max_pixels: int = auto("data.max_pixels", 4194304)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn rollouts with tools and an environment (docs/agents.md)."""
    limit_videos: int = 0
    """Videos per prompt at most (vLLM's ``limit_mm_per_prompt``); raised at start-up to the most a row of the data
    has (a log line says so), so 0 is right for image and text data (vLLM then profiles no video)."""

    def check(self) -> None:
        """``val_override_config`` names only ``VAL_OVERRIDES``, each in its field's range. Raises ``ConfigError``."""
        for name in self.val_override_config:
            if name not in VAL_OVERRIDES:
                close = difflib.get_close_matches(str(name), VAL_OVERRIDES, n=1, cutoff=0.6)
                raise ConfigError(f"Unknown key 'worker.rollout.val_override_config.{name}'."
                                  + (f" Did you mean: {close[0]}?" if close else "")
                                  + f" Validation can override: {', '.join(VAL_OVERRIDES)}.")
        validate(self.val_override_config, RolloutConfig, "worker.rollout.val_override_config.")


@dataclass
class RewardConfig:
    """The reward function: a Python file and function, called on the trainer process."""

    reward_type: Literal["auto", "batch", "sequential"] = "auto"
    """batch: the function receives all samples; sequential: one sample per call; auto: the reward file's
    ``REWARD_TYPE``, else batch (other libraries' reward functions: ``easyrl.rewards.styles``)."""
    reward_function: Optional[str] = None
    """``path/to/file.py:function_name``; ``path/to/file.py`` alone names ``main``."""
    reward_function_kwargs: dict[str, Any] = field(default_factory=dict)
    skip_special_tokens: bool = True
    on_error: Literal["raise", "zero"] = "raise"
    """When the function raises or times out on a sample: ``raise`` stops the run, naming the step, the sample and
    its response; ``zero`` scores that sample 0 on every name, logs it and counts it in ``reward/errors``."""
    timeout_s: Optional[float] = 300.0
    """Seconds one call of the function may take (a batch call, or one sample's call when ``sequential``); beyond
    it the call counts as an error. The function then runs in a helper process, which is killed and restarted on a
    timeout. null: no limit, the function runs in the trainer's process."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """A generative LLM judge (vLLM on the workers) whose parsed verdict is the named score ``judge``, added to
    ``overall`` with ``judge.weight`` (``easyrl.config.judge``, docs/judge.md); off while ``judge.model_path`` is
    null."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A discriminative reward model scoring on the workers (``easyrl.config.reward_model``; off by default)."""


WORKER_OWNED_ENV = dict.fromkeys(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"),
                                 "its place in the process group") | {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0: the in-process vLLM engine that takes the actor's weights as tensors"}
"""Environment variables every worker sets itself at start-up (``easyrl.workers.fsdp_worker``), over ``env_vars``."""


@dataclass
class WorkerConfig:
    """Everything that runs on the workers (one Ray actor per device)."""

    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Built only for ``algorithm.adv_estimator: gae``."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    nccl_timeout: Annotated[int, POSITIVE] = 1800
    """Seconds a collective (NCCL, HCCL or gloo) may wait for the other ranks before the run fails."""
    env_vars: dict[str, str] = field(default_factory=dict)
    """Environment variables of every worker process, on every node (Ray's ``runtime_env.env_vars``), set before the
    process starts, so ``LD_PRELOAD`` works; they override easyrl's own worker settings of the same name
    (docs/multinode.md)."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The frozen teacher of on-policy distillation, built only when ``algorithm.needs_teacher``
    (``easyrl.config.teacher``)."""

    def check(self) -> None:
        """Every ``env_vars`` name is an environment variable name (letters, digits, ``_``; not starting with a
        digit); values are strings by the field's type. Raises ``ConfigError``."""
        for name in self.env_vars:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(name)):
                raise ConfigError(f"worker.env_vars has the name {name!r}, which is not an environment variable name "
                                  "(letters, digits and _, not starting with a digit).")
            if name in WORKER_OWNED_ENV:
                raise ConfigError(f"worker.env_vars sets {name}, which each worker sets itself ({WORKER_OWNED_ENV[name]}"
                                  "): yours would be overwritten. Remove it from worker.env_vars.")
