"""``worker:``: the rollout engine (vLLM) and its multi-turn rollouts (docs/agents.md), the reward function and the
reward model (docs/rewards.md; responses decoded with the policy's tokenizer, re-encoded with the reward model's),
and the section that holds every worker part."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from annotated_types import Ge

from easyrl.config.actor import ActorConfig, RefConfig, RoutedTeacherConfig, TeacherConfig
from easyrl.config.fields import FRACTION, NON_NEGATIVE, POSITIVE, AllowInf, Note, auto, input_path, validate
from easyrl.config.judge import JudgeConfig
from easyrl.config.role import CriticConfig, Dtype, OffloadConfig
from easyrl.errors import ConfigError

VAL_OVERRIDES = ("n", "temperature", "top_p", "top_k")
"""The sampling settings ``worker.rollout.val_override_config`` may replace during validation (workers/rollout.py)."""
BUILTIN_FORMATS = ("hermes",)
"""Tool-call parsers shipped with easyrl (``easyrl.agents.parsers``)."""
TURNS = Optional[Annotated[int, Ge(1), Note("null: no limit")]]


@dataclass
class MultiTurnConfig:
    """Each trajectory alternates assistant turns and tool (or environment) turns until a final answer,
    ``max_assistant_turns`` or ``data.max_response_length`` tokens."""

    enable: bool = False
    """Use the multi-turn rollout (``easyrl.trainer.multi_turn.MultiTurnRollout``) instead of one response per
    prompt."""
    max_assistant_turns: TURNS = None
    """Assistant turns per trajectory at most (null: only the token budget limits them)."""
    max_user_turns: TURNS = None
    """Environment (user) turns per trajectory at most (null: no limit but the token budget)."""
    max_tool_response_length: Annotated[int, POSITIVE] = 256
    """Characters of one tool's answer kept (longer ones are cut)."""
    format: str = input_path("hermes")
    """Tool-call parser: ``hermes`` (Qwen2.5/Qwen3/Qwen3-VL ``<tool_call>{json}</tool_call>``) or
    ``path/to/file.py:function`` taking the assistant text and returning a list of ``{"name", "arguments"}`` dicts."""
    tools: list[str] = input_path(default_factory=list)
    """``path/to/file.py:function`` per tool; the JSON schema comes from the signature and the Google-style
    docstring (``transformers.utils.get_json_schema``) and goes into the chat template as ``tools=``."""
    tool_timeout_s: Annotated[float, POSITIVE] = 30.0
    """Seconds one tool call may take; beyond, the call's process is killed and the model reads a timeout."""
    num_tool_workers: Annotated[int, POSITIVE] = 4
    """Processes that run tool calls in parallel."""
    max_turn_tokens: TURNS = None
    """Tokens one assistant turn may generate at most (null: the rest of ``data.max_response_length``); a turn cut
    by it is parsed for tool calls like any other."""
    environment: Optional[str] = input_path()
    """``path/to/file.py:function``, called as ``fn(messages)`` after an assistant turn without a tool call:
    returns the next user/environment message (a string, or a ``{"role", "content"}`` dict) or None (done)."""
    patience: Optional[Annotated[float, AllowInf(), NON_NEGATIVE,
                                 Note("inf: every round waits for every tool call")]] = None
    """null (default): no rounds; each trajectory's next turn goes to the engines as soon as its tools answered
    (request by request, ``easyrl.agents.scheduler.run_requests``). A number: assistant turns in rounds, and how long
    the driver waits for late tool calls before the next round starts without them, in units of the last round's
    generation time (50 ms at least): waiting idles the engines, a round without the late ones costs them a later
    round. ``inf``: every round waits for its slowest tool call (the round barrier); 0: a round starts as soon as one
    trajectory is ready."""


def check_spec(key: str, spec: str) -> None:
    """A ``path/to/file.py:function`` spec whose file exists."""
    if not isinstance(spec, str) or ":" not in spec or not spec.rsplit(":", 1)[1].isidentifier():
        raise ConfigError(f"{key}={spec!r} is not of the form path/to/file.py:function; write e.g. "
                          f"{key}=examples/agents/tools.py:calculator.")
    path = spec.rsplit(":", 1)[0]
    if not os.path.isfile(path):
        raise ConfigError(f"{key}={spec!r}: no file {path!r} (relative paths start at the working directory "
                          f"{os.getcwd()!r}).")


def check_multi_turn(config: MultiTurnConfig) -> None:
    """Values of ``worker.rollout.multi_turn`` when ``enable``. Raises ``ConfigError``: an unknown ``format``, a
    malformed or missing ``tools``/``format``/``environment`` file, a tool name twice, or neither tools nor an
    environment."""
    if not config.enable:
        return
    key = "worker.rollout.multi_turn"
    if config.format not in BUILTIN_FORMATS:
        if ":" not in config.format:
            raise ConfigError(f"{key}.format={config.format!r} is not one of: {', '.join(BUILTIN_FORMATS)}, "
                              "nor a parser path/to/file.py:function.")
        check_spec(f"{key}.format", config.format)
    for i, spec in enumerate(config.tools):
        check_spec(f"{key}.tools[{i}]", spec)
    names = [spec.rsplit(":", 1)[1] for spec in config.tools]
    if len(set(names)) != len(names):
        raise ConfigError(f"{key}.tools names the function(s) {sorted({n for n in names if names.count(n) > 1})} "
                          "more than once: every tool needs its own function name.")
    if config.environment is not None:
        check_spec(f"{key}.environment", config.environment)
    if not config.tools and config.environment is None:
        raise ConfigError(f"{key}.enable=true with neither {key}.tools nor {key}.environment: give at least one "
                          f"tool (path/to/file.py:function) or an environment, or set {key}.enable=false.")


@dataclass
class AgentConfig:
    """A black-box agent trained through an OpenAI-compatible endpoint on the rollout engines (docs/agents.md, "Bring
    your agent"): each sample is one agent session, its trajectory the tokens the engines sampled for its requests."""

    entry_point: Optional[str] = input_path()
    """``path/to/file.py:function``, called once per sample as ``fn(task=..., base_url=..., api_key=..., model=...)``
    in a thread of its own: ``task`` the data row's columns (the prompt under ``prompt``, the answer under
    ``ground_truth``), the other three for an ``openai.OpenAI(base_url=..., api_key=...)`` client and its ``model=``.
    What it returns reaches the reward function as ``agent_result``. null: no agent."""
    timeout_s: Annotated[float, POSITIVE] = 300.0
    """Seconds one agent session may take; a later one is counted (``agent/timeouts``) and trains nothing."""
    max_sessions: Annotated[int, POSITIVE] = 64
    """Agent sessions run at once at most (threads on the driver)."""
    tool_call_parser: Optional[str] = "hermes"
    """vLLM's tool-call parser for the endpoint's chat completions (``vllm serve --tool-call-parser``; ``hermes`` for
    Qwen2.5/Qwen3); null: tool calls are not parsed (the agent reads the text)."""

    @property
    def enabled(self) -> bool:
        """Whether an agent is configured."""
        return self.entry_point is not None


TRANSFER_BUCKETS_IN_FLIGHT = 2
"""Buckets of ``update_weights_bucket_megabytes`` a split placement's transfer holds at once on each side
(``easyrl.workers.weight_transfer``; device review 2026-12-02, S3-N9): the trainer's rank 0 gathers bucket ``b + 1``
while bucket ``b`` is broadcast, a rollout rank receives ``b + 1`` while vLLM loads ``b``; 1 would be one at a
time. The rollout side's memory estimate counts them (``easyrl.sizing.estimate.transfer_gib``)."""


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
    collectives, more transient device memory (a split placement holds :data:`TRANSFER_BUCKETS_IN_FLIGHT` of them on
    each side)."""
    n_gpus_per_node: Optional[Annotated[int, POSITIVE]] = None
    """``trainer.rollout_mode: one_step_off`` or ``async`` only: devices per node of the rollout engines, apart from
    the trainer's ``trainer.n_gpus_per_node`` (verl's ``rollout.n_gpus_per_node``); null:
    colocated."""
    enforce_eager: bool = False
    enable_chunked_prefill: bool = False
    max_num_batched_tokens: Annotated[int, POSITIVE] = 8192
    limit_images: Annotated[int, NON_NEGATIVE] = 1
    """Images per prompt at most (vLLM's ``limit_mm_per_prompt``); in a multi-turn rollout the prompt's and the tools'
    images of one conversation (more tool images are dropped and counted, docs/agents.md "Tool images"). A data row
    with more images is refused before Ray (unlike ``limit_videos``, not raised from the data)."""
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
    agent: AgentConfig = field(default_factory=AgentConfig)
    """A black-box agent served through an OpenAI-compatible endpoint (docs/agents.md, "Bring your agent")."""
    limit_videos: int = 0
    """Videos per prompt at most (vLLM's ``limit_mm_per_prompt``); raised at start-up to the most a row of the data
    has (a log line says so), so 0 is right for image and text data (vLLM then profiles no video)."""

    @property
    def max_model_len(self) -> int:
        """Tokens of the engine's context, vLLM's ``max_model_len``: ``prompt_length + response_length``."""
        return self.prompt_length + self.response_length

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
class RewardModelConfig:
    """A frozen sequence-classification model (``AutoModelForSequenceClassification``, ``num_labels: 1``), FSDP2-sharded
    over the workers like the reference policy; its score of each sample is ``score/reward_model`` and adds
    ``weight x score`` to the sample's reward (``overall``)."""

    model_path: Optional[str] = input_path()
    """A hub id or local folder of the reward model; null: no reward model."""
    tokenizer_path: Optional[str] = input_path()
    """The reward model's tokenizer (its chat template); null: ``model_path``."""
    weight: float = 1.0
    """The score's weight in the reward: ``overall = rule overall + weight x score``. Without a rule reward
    (``worker.reward.reward_function: null``) the rule's ``overall`` is 0 and the reward model scores alone."""
    micro_batch_size_per_device: Annotated[int, POSITIVE] = 16
    """Samples per forward on one device; with ``dynamic_batching`` the token budget's unit."""
    dynamic_batching: bool = True
    """Form micro-batches by a token budget (``max_token_len_per_device``) instead of a fixed sample count."""
    max_token_len_per_device: Optional[Annotated[int, POSITIVE]] = None
    """Tokens per micro-batch with ``dynamic_batching``; null: ``micro_batch_size_per_device`` x the step's longest
    reward-model input."""
    max_length: Optional[Annotated[int, POSITIVE]] = None
    """Tokens of one reward-model input (chat-templated prompt + response) at most; a longer input keeps its last
    ``max_length`` tokens (the end of the response, where the model reads its score) and is counted in
    ``reward_model/truncated``. null: no limit."""
    chat_template: Optional[str] = input_path()
    """A Jinja chat template (or a file holding one) replacing the reward model tokenizer's own; it is applied to
    ``[{role: user, content: prompt}, {role: assistant, content: response}]``. null: the tokenizer's template."""
    trust_remote_code: bool = False
    offload: OffloadConfig = field(default_factory=lambda: OffloadConfig(offload_params=True))
    """Keep the parameters on the host between uses (as ``worker.ref.offload``); ignored on the CPU."""
    param_dtype: str = auto("worker.actor.fsdp.param_dtype", "bf16")
    """The dtype the reward model is held and run in: the actor's compute dtype (as the reference's)."""

    @property
    def enabled(self) -> bool:
        """Whether a reward model scores the responses (``model_path`` is set)."""
        return bool(self.model_path)


def check_reward_model(config: Any) -> None:
    """The reward model's settings of a ``PPOConfig`` (its checkpoint is checked by ``easyrl.trainer.preflight``).
    Raises ``ConfigError`` naming the key: an empty ``chat_template`` or one naming a file that does not exist, or an
    estimator whose greedy baselines the rule reward alone scores (ReMax)."""
    rm = config.worker.reward.reward_model
    if not rm.enabled:
        return
    key = "worker.reward.reward_model"
    if rm.chat_template is not None and not rm.chat_template.strip():
        raise ConfigError(f"{key}.chat_template is empty: give a Jinja template or a file holding one, or null for the "
                          "reward model tokenizer's own.")
    if rm.chat_template is not None and _names_a_missing_file(rm.chat_template):
        raise ConfigError(f"{key}.chat_template={rm.chat_template!r} names a file that does not exist (a template "
                          "holds '{'; this value looks like a path): give the path of an existing Jinja file, the "
                          "template itself, or null for the reward model tokenizer's own.")
    if config.algorithm.estimator("needs_reward_baselines"):
        raise ConfigError(f"{key}.model_path is set with algorithm.adv_estimator={config.algorithm.adv_estimator}: "
                          "its greedy baseline is scored by the rule reward only; use grpo (or another estimator) "
                          "with a reward model.")


def _names_a_missing_file(value: str) -> bool:
    """Whether a ``chat_template`` value reads as a file's path (it ends in ``.jinja``, ``.j2`` or ``.txt``, or holds
    a path separator, and holds no ``{``, which every Jinja template does) that is no file."""
    looks_like_path = value.strip().endswith((".jinja", ".j2", ".txt")) or "/" in value or os.sep in value
    return looks_like_path and "{" not in value and not os.path.isfile(os.path.expanduser(value))


def read_chat_template(value: Optional[str]) -> Optional[str]:
    """``worker.reward.reward_model.chat_template`` as a Jinja string: the file's text when it names a file, else
    the value itself (None stays None)."""
    if value is not None and os.path.isfile(os.path.expanduser(value)):
        with open(os.path.expanduser(value), encoding="utf-8") as f:
            return f.read()
    return value


@dataclass
class RewardConfig:
    """The reward function: a Python file and function, called on the trainer process."""

    reward_type: Literal["auto", "batch", "sequential"] = "auto"
    """batch: the function receives all samples; sequential: one sample per call; auto: the reward file's
    ``REWARD_TYPE``, else batch (other libraries' reward functions: ``easyrl.rewards.styles``)."""
    reward_function: Optional[str] = input_path()
    """``path/to/file.py:function_name``; ``path/to/file.py`` alone names ``main``."""
    reward_function_kwargs: dict[str, Any] = field(default_factory=dict)
    skip_special_tokens: bool = True
    on_error: Literal["raise", "zero"] = "raise"
    """When the function raises or times out on a sample: ``raise`` stops the run, naming the step, the sample and
    its response; ``zero`` scores that sample 0 on every name, logs it and counts it in ``reward/errors``."""
    timeout_s: Optional[Annotated[float, POSITIVE]] = 300.0
    """Seconds one call of the function may take (a batch call, or one sample's call when ``sequential``); beyond
    it the call counts as an error. The function then runs in a helper process, which is killed and restarted on a
    timeout. null: no limit, the function runs in the trainer's process."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """A generative LLM judge (vLLM on the workers) whose parsed verdict is the named score ``judge``, added to
    ``overall`` with ``judge.weight`` (``easyrl.config.judge``, docs/judge.md); off while ``judge.model_path`` is
    null."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A discriminative reward model scoring on the workers (``RewardModelConfig``; off by default)."""


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
    (docs/multinode.md). Those easyrl reads (``OMP_NUM_THREADS``, ``VLLM_CPU_KVCACHE_SPACE``, ``EASYRL_*``) are
    read before Ray starts, an override logged (``easyrl.envvars``, docs/environment.md)."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The frozen teacher of on-policy distillation, built only when ``algorithm.needs_teacher``
    (``easyrl.config.actor``)."""
    teachers: dict[str, RoutedTeacherConfig] = field(default_factory=dict)
    """Several teachers, by name, each scoring the samples of its data sources (multi-teacher on-policy distillation,
    docs/distillation.md "Several teachers"); instead of ``worker.teacher``, which is the one-teacher case."""

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
