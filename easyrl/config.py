"""The whole run configuration: plain dataclasses, merged by OmegaConf.

Precedence (later wins): dataclass defaults <- the YAML named by ``config=`` <- dotted CLI overrides, e.g.::

    python -m easyrl.trainer config=config.yaml data.max_prompt_length=1024 worker.rollout.n=8

Semantics follow EasyR1: batch sizes are counted in prompts (``data.rollout_batch_size``,
``worker.actor.global_batch_size``); each prompt is sampled ``worker.rollout.n`` times inside. Values that follow
from others ("auto keys", marked ``metadata={"auto": ...}``) are filled in by ``PPOConfig.finalize`` and cannot be set
by users: setting one fails and names the key to set instead. An unknown key fails before any work starts, naming the
key and the closest valid ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import OmegaConf

from easyrl.config_checks import check_config
from easyrl.errors import ConfigError  # noqa: F401  (re-exported: `from easyrl.config import ConfigError`)


def auto(source: str, default: Any = None) -> Any:
    """A field derived from ``source``; users cannot set it (see ``PPOConfig.finalize``)."""
    return field(default=default, metadata={"auto": source})


@dataclass
class DataConfig:
    """Where the prompts come from and how they are turned into model inputs."""

    train_files: str = "hiyouga/geometry3k@train"
    """A hub id ``name@split``, a local parquet/json/jsonl file or folder, or a raw InterGPS geometry3k folder."""
    val_files: Optional[str] = "hiyouga/geometry3k@test"
    """Same forms as ``train_files``; null = no validation."""
    prompt_key: str = "problem"
    answer_key: str = "answer"
    image_key: Optional[str] = "images"
    """Column holding the images; null = text-only (no column is read as images)."""
    image_dir: Optional[str] = None
    """Folder that relative image paths in the data are resolved against."""
    max_prompt_length: int = 1024
    """Tokens, image tokens included; longer prompts are filtered out (``filter_overlong_prompts``)."""
    max_response_length: int = 1024
    """Tokens generated per sample at most."""
    rollout_batch_size: int = 512
    """Prompts per training step (each sampled ``worker.rollout.n`` times)."""
    val_batch_size: int = -1
    """Prompts per validation batch; -1 = the whole validation set at once."""
    format_prompt: Optional[str] = None
    """Path of a Jinja2 template that receives ``content`` (the problem) and renders the user message."""
    shuffle: bool = True
    seed: int = 1
    min_pixels: int = 262144
    max_pixels: int = 4194304
    filter_overlong_prompts: bool = True


@dataclass
class AlgorithmConfig:
    """The RL algorithm: advantage estimator and KL regularisation."""

    adv_estimator: str = "grpo"
    """One of ``easyrl.algorithms.advantages.ADV_ESTIMATORS``: grpo, rloo, reinforce_plus_plus, ..."""
    norm_adv_by_std_in_grpo: bool = True
    """False gives Dr.GRPO (no division by the group's std)."""
    gamma: float = 1.0
    disable_kl: bool = False
    """Skip the reference model entirely (no ref forward, no ref memory)."""
    use_kl_loss: bool = True
    """KL as a loss term of the actor; ``use_kl_in_reward`` puts it in the reward instead."""
    use_kl_in_reward: bool = False
    kl_penalty: str = "low_var_kl"
    """KL estimator: kl (k1), abs, mse (k2), low_var_kl (k3)."""
    kl_coef: float = 1e-2
    kl_type: str = "fixed"
    """Controller of the in-reward KL coefficient: fixed or adaptive."""
    kl_target: float = 0.1
    kl_horizon: float = 10000.0
    online_filtering: bool = False
    """DAPO dynamic sampling: drop groups whose ``filter_key`` scores are all equal or whose mean lies outside
    [``filter_low``, ``filter_high``], and keep generating until ``data.rollout_batch_size`` groups are kept."""
    filter_key: str = "overall"
    """The reward name that online filtering looks at (``overall``, ``accuracy``, ...)."""
    filter_low: float = 0.01
    filter_high: float = 0.99
    max_try_make_batch: int = 20
    """Generation rounds per step at most when filtering; then the step fails with a clear error (-1: no limit)."""

    @property
    def needs_reference(self) -> bool:
        """Whether a KL term (loss or in-reward) uses the reference policy; otherwise none is built or run."""
        return not self.disable_kl and (self.use_kl_loss or self.use_kl_in_reward)


@dataclass
class LoraConfig:
    """LoRA with peft (``easyrl/models/lora.py``; EasyR1's keys). Only the adapter is trained; the reference policy is
    the base model (the adapter switched off); vLLM receives the merged weights ``W + alpha / rank * B @ A``."""

    rank: int = 0
    """Rank of the adapter matrices; 0 = LoRA off (full fine-tuning)."""
    alpha: float = 64
    """The adapter's output is scaled by ``alpha / rank``."""
    target_modules: str = "all-linear"
    """``all-linear`` (every linear layer but the output head) or comma-separated module names
    (``q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj``)."""
    exclude_modules: Optional[str] = ".*visual.*"
    """A regular expression of full module names left without adapter; by default the vision tower of Qwen-VL
    models (``model.visual``). null: none."""


@dataclass
class ModelConfig:
    """The policy checkpoint (actor, reference and rollout all start from it)."""

    model_path: Optional[str] = None
    """A hub id or local folder in Hugging Face format."""
    tokenizer_path: Optional[str] = None
    """Defaults to ``model_path``."""
    trust_remote_code: bool = False
    freeze_vision_tower: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)
    npu_fused_kernels: bool = False
    """Ascend only (``trainer.device=npu``): torch_npu's fused RMSNorm, SwiGLU and rotary kernels in the actor and
    reference (``easyrl/models/npu_kernels.py``); ignored on other devices."""


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule (linear warm-up, then constant)."""

    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 1e-2
    lr_warmup_ratio: float = 0.0
    """Fraction of ``training_steps`` with a linear warm-up; constant afterwards."""
    training_steps: int = auto("trainer", -1)


@dataclass
class FSDPConfig:
    """FSDP2 (``fully_shard``) settings: mixed precision, activation checkpointing, resharding."""

    param_dtype: str = "bf16"
    """Compute dtype of the sharded parameters (bf16, fp16 or fp32); fp32 on the CPU."""
    reduce_dtype: str = "fp32"
    enable_gradient_checkpointing: bool = True
    reshard_after_forward: bool = True


@dataclass
class OffloadConfig:
    """Host offloading of a sharded model."""

    offload_params: bool = False
    """Keep parameters (and with them gradients and optimizer states: FSDP2's ``CPUOffloadPolicy``) on the host;
    they are copied to the device block by block when used. Ignored on the CPU."""


@dataclass
class ActorConfig:
    """The trained policy: batch sizes (mini-batch in prompts, micro-batches in samples), policy loss, KL/entropy terms."""

    global_batch_size: int = 256
    """Prompts per optimizer step (a mini-batch); the rollout batch is split into such mini-batches."""
    micro_batch_size_per_device_for_update: int = 4
    """Samples per forward/backward on one device."""
    micro_batch_size_per_device_for_experience: int = 16
    """Samples per forward when computing old/ref log-probs."""
    max_grad_norm: float = 1.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.3
    clip_ratio_dual: float = 3.0
    loss_type: str = "vanilla"
    """Policy loss: vanilla (PPO clip, dual-clip), gspo, cispo, sapo."""
    loss_agg_mode: str = "token-mean"
    """token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm (verl's: a sum over sequences),
    seq-mean-token-sum-norm-drgrpo (Dr. GRPO's: a mean over sequences); see docs/algorithms.md."""
    tau_positive: float = 1.0
    """SAPO gate temperature for tokens with a positive advantage (``loss_type: sapo``)."""
    tau_negative: float = 1.05
    """SAPO gate temperature for tokens with a zero or negative advantage (``loss_type: sapo``)."""
    ppo_epochs: int = 1
    entropy_coeff: float = 0.0
    tis_cap: Optional[float] = None
    """Truncated importance sampling cap against vLLM's sampled-token log-probs; None disables it."""
    padding_free: bool = True
    """Pack each micro-batch's sequences into one row without padding (per-sequence positions, varlen attention,
    no full-vocabulary logits); false runs the padded batch with an attention mask. Fixed at start-up."""
    dynamic_batching: bool = True
    """Form micro-batches by a token budget (``max_token_len_per_device``) instead of a fixed sample count; the
    loss normalisation over the mini-batch is unchanged."""
    max_token_len_per_device: Optional[int] = None
    """Tokens (prompt + response, no padding) per micro-batch with ``dynamic_batching``; None: the phase's
    ``micro_batch_size_per_device_for_*`` x (``data.max_prompt_length`` + ``data.max_response_length``)."""
    max_consecutive_skips: int = 5
    """An optimizer step whose gradient norm is NaN/inf is skipped (counted as ``actor/skipped_steps``); this many
    skips in a row stop the run with an error (<= 0: never)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    # copied from algorithm.*
    use_kl_loss: bool = auto("algorithm.use_kl_loss", True)
    kl_penalty: str = auto("algorithm.kl_penalty", "low_var_kl")
    kl_coef: float = auto("algorithm.kl_coef", 1e-2)
    disable_kl: bool = auto("algorithm.disable_kl", False)
    temperature: float = auto("worker.rollout.temperature", 1.0)


@dataclass
class RefConfig:
    """The frozen reference policy (built only when a KL term uses it)."""

    offload: OffloadConfig = field(default_factory=lambda: OffloadConfig(offload_params=True))
    micro_batch_size_per_device_for_experience: int = auto("worker.actor.micro_batch_size_per_device_for_experience", 16)


@dataclass
class RolloutConfig:
    """The colocated vLLM engine: sampling settings, memory, validation overrides."""

    n: int = 5
    """Samples per prompt (the GRPO group size)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 1
    dtype: str = "bf16"
    gpu_memory_utilization: float = 0.6
    """Fraction of device memory vLLM may take (weights + KV cache); ignored on the CPU."""
    cpu_kvcache_space_gib: float = 1.0
    """KV cache size on the CPU backend (GiB)."""
    update_weights_bucket_megabytes: int = 1024
    """Weight sync: full-tensor MiB (in ``dtype``) gathered per collective and handed to vLLM at once (verl's name);
    larger = fewer collectives, more transient device memory."""
    enforce_eager: bool = False
    enable_chunked_prefill: bool = False
    max_num_batched_tokens: int = 8192
    limit_images: int = 1
    """Images per prompt at most (vLLM's ``limit_mm_per_prompt``)."""
    calculate_log_probs: bool = False
    """Keep vLLM's sampled-token log-probs (``rollout_log_probs``), needed by ``worker.actor.tis_cap``."""
    val_override_config: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.6, "n": 1})
    """Sampling settings that replace the above during validation."""
    disable_tqdm: bool = True
    prompt_length: int = auto("data.max_prompt_length", 1024)
    response_length: int = auto("data.max_response_length", 1024)
    trust_remote_code: bool = auto("worker.actor.model.trust_remote_code", False)
    min_pixels: int = auto("data.min_pixels", 262144)
    max_pixels: int = auto("data.max_pixels", 4194304)


@dataclass
class RewardConfig:
    """The reward function: a Python file and function, called on the trainer process."""

    reward_type: str = "batch"
    """batch: the function receives all samples; sequential: one sample per call."""
    reward_function: Optional[str] = None
    """``path/to/file.py:function_name``."""
    reward_function_kwargs: dict[str, Any] = field(default_factory=dict)
    skip_special_tokens: bool = True
    on_error: str = "raise"
    """When the function raises or times out on a sample: ``raise`` stops the run, naming the step, the sample and
    its response; ``zero`` scores that sample 0 on every name, logs it and counts it in ``reward/errors``."""
    timeout_s: Optional[float] = 300.0
    """Seconds one call of the function may take (a batch call, or one sample's call when ``sequential``); beyond
    it the call counts as an error. The function then runs in a helper process, which is killed and restarted on a
    timeout. null: no limit, the function runs in the trainer's process."""


@dataclass
class WorkerConfig:
    """Everything that runs on the workers (one Ray actor per device)."""

    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    nccl_timeout: int = 1800
    """Seconds a collective (NCCL, HCCL or gloo) may wait for the other ranks before the run fails (verl's name)."""


@dataclass
class TrainerConfig:
    """The training loop: length, validation, logging, devices, output folders."""

    total_epochs: int = 15
    max_steps: Optional[int] = None
    """Stop after this many steps (None: ``total_epochs`` passes over the data)."""
    project_name: str = "easyrl"
    experiment_name: str = "demo"
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Any of console, jsonl, wandb, tensorboard, swanlab, mlflow (see docs/metrics.md; the last three are extras)."""
    nnodes: int = 1
    n_gpus_per_node: int = 8
    """Devices per node (GPUs, NPUs, or CPU ranks on a CPU-only machine)."""
    device: str = "auto"
    """auto, cuda, npu or cpu."""
    cpu_threads_per_worker: int = 1
    """CPU path only: torch/OpenMP threads of each worker (its FSDP actor and its vLLM engine), and the CPUs Ray
    reserves for it. On a 2-core machine one worker with 2 threads was as fast as two workers with one each, with
    half the RAM. Ignored on GPUs/NPUs."""
    val_freq: int = -1
    """Validate every this many steps; -1 never (besides ``val_before_train``)."""
    val_before_train: bool = True
    val_only: bool = False
    val_generations_to_log: int = 0
    """Log the first this many validation samples (prompt, response, ground truth, score) as a table."""
    save_model_path: Optional[str] = None
    """Where the final actor is exported in Hugging Face format; default ``<run_dir>/huggingface``."""
    save_freq: int = 5
    """Save a checkpoint every this many steps (and always after the last step); -1: only after the last step."""
    save_limit: int = -1
    """Keep the newest this many checkpoints, plus the best one (``best_metric``); -1 keeps all."""
    save_checkpoint_path: Optional[str] = None
    """Folder of the run's ``global_step_N`` checkpoints and ``checkpoint_tracker.json``; default ``run_dir``."""
    load_checkpoint_path: Optional[str] = None
    """A ``global_step_N`` folder to resume from (overrides ``find_last_checkpoint``)."""
    find_last_checkpoint: bool = True
    """Resume from the last complete checkpoint under ``save_checkpoint_path`` if there is one."""
    best_metric: str = "val/reward/overall"
    """The validation metric that ranks checkpoints (the best is never removed by ``save_limit``)."""
    best_metric_mode: str = "max"
    """max or min: which direction of ``best_metric`` is better."""
    run_dir: str = auto("trainer.project_name/experiment_name", "")
    """``runs/<project_name>/<experiment_name>``: metrics JSONL, exported model."""
    runs_root: str = "runs"
    balance_batch: bool = True
    """Reorder each step's batch so that every worker's share holds about as many tokens (Karmarkar-Karp)."""


@dataclass
class PPOConfig:
    """The whole run configuration (the root of the YAML)."""

    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def finalize(self) -> "PPOConfig":
        """Fill in the auto keys and check every value (``easyrl.config_checks``). Raises ``ConfigError``."""
        actor, rollout, algo = self.worker.actor, self.worker.rollout, self.algorithm
        rollout.prompt_length = self.data.max_prompt_length
        rollout.response_length = self.data.max_response_length
        rollout.trust_remote_code = actor.model.trust_remote_code
        rollout.min_pixels, rollout.max_pixels = self.data.min_pixels, self.data.max_pixels
        actor.use_kl_loss = algo.use_kl_loss
        actor.kl_penalty = algo.kl_penalty
        actor.kl_coef = algo.kl_coef
        actor.disable_kl = algo.disable_kl
        actor.temperature = rollout.temperature
        self.worker.ref.micro_batch_size_per_device_for_experience = actor.micro_batch_size_per_device_for_experience
        self.trainer.run_dir = os.path.join(
            self.trainer.runs_root, self.trainer.project_name, self.trainer.experiment_name
        )
        if self.trainer.save_checkpoint_path is None:
            self.trainer.save_checkpoint_path = self.trainer.run_dir
        check_config(self)
        from easyrl.config_warnings import warn_config_traps

        warn_config_traps(self)
        return self

    @property
    def on_policy_update(self) -> bool:
        """Whether the update is provably on-policy, so the old-log-prob pass can be skipped (verl does the same):
        one epoch over one mini-batch (``ppo_epochs == 1``, ``global_batch_size == data.rollout_batch_size``), so
        every forward of the update runs before its only optimizer step and its detached log-probs are the old
        ones; no truncated importance sampling (``tis_cap``) and no in-reward KL, which need old log-probs before
        the update."""
        actor, algo = self.worker.actor, self.algorithm
        return (actor.ppo_epochs == 1 and actor.global_batch_size == self.data.rollout_batch_size
                and actor.tis_cap is None and not (algo.use_kl_in_reward and not algo.disable_kl))

    @property
    def world_size(self) -> int:
        """Number of workers (devices): ``trainer.nnodes * trainer.n_gpus_per_node``."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node


def _auto_keys(cls: type, prefix: str = "") -> dict[str, str]:
    """Dotted names of the auto fields of ``cls`` (recursively) -> the key they are derived from."""
    found = {}
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        sub = _field_dataclass(f)
        if "auto" in f.metadata:
            found[name] = f.metadata["auto"]
        elif sub is not None:
            found.update(_auto_keys(sub, name + "."))
    return found


def _field_dataclass(f: dataclasses.Field) -> Optional[type]:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return type(value)
    return None


def _valid_keys(cls: type, prefix: str = "") -> dict[str, bool]:
    """All dotted keys of ``cls`` -> whether the key holds a free-form dict (its children are not checked)."""
    keys = {}
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        sub = _field_dataclass(f)
        if sub is not None:
            keys[name] = False
            keys.update(_valid_keys(sub, name + "."))
        else:
            keys[name] = "dict" in str(f.type)
    return keys


def _check_keys(user: dict, source: str, valid: dict[str, bool], autos: dict[str, str], prefix: str = "") -> None:
    for key, value in user.items():
        name = f"{prefix}{key}"
        if name not in valid:
            settable = [k for k in valid if k not in autos]
            close = difflib.get_close_matches(name, settable, n=3, cutoff=0.6)
            leaf = [k for k in settable if k.rsplit(".", 1)[-1] == str(key)]
            hint = close or leaf[:3]
            raise ConfigError(
                f"Unknown config key '{name}' (from {source})."
                + (f" Did you mean: {', '.join(hint)}?" if hint else "")
            )
        if name in autos:
            raise ConfigError(
                f"'{name}' (from {source}) is derived automatically from {autos[name]}; set that instead."
            )
        is_section = not valid[name] and any(k.startswith(name + ".") for k in valid)
        if is_section and value is not None and not isinstance(value, dict):
            raise ConfigError(f"'{name}' (from {source}) is a section: give a mapping of its keys, got {value!r}.")
        if isinstance(value, dict) and not valid[name]:
            _check_keys(value, source, valid, autos, name + ".")


def _has_dotted(tree: dict, key: str) -> bool:
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _pop_dotted(tree: dict, key: str) -> Any:
    *parents, last = key.split(".")
    node = tree
    for part in parents:
        node = node[part]
    return node.pop(last)


def _merge_error(err: Exception, source: str) -> str:
    """One line for an OmegaConf merge error (a value of the wrong type), naming the key where OmegaConf knows it."""
    key = getattr(err, "full_key", None)
    message = (getattr(err, "msg", None) or str(err)).strip().splitlines()[0].rstrip(".")
    if key:
        return f"Bad value for '{key}' (from {source}): {message}."
    return f"Bad value in {source}: {message} (a section must be a mapping of keys)."


def _load_yaml(path: str) -> dict:
    """The mapping in the YAML file at ``path``; raises ``ConfigError`` naming the file (and line) otherwise."""
    import yaml

    try:
        conf = OmegaConf.load(path)
    except yaml.YAMLError as err:
        mark, context = getattr(err, "problem_mark", None), getattr(err, "context_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if context is not None and getattr(err, "context", None) and context.line != getattr(mark, "line", None):
            problem += f" ({err.context} that starts at line {context.line + 1})"
        raise ConfigError(f"Config file '{path}' (from config=) is not valid YAML:{where}: {problem}.") from None
    except Exception as err:  # omegaconf's own errors (e.g. a key it cannot represent), unreadable file
        raise ConfigError(f"Config file '{path}' (from config=) cannot be read: {err}") from None
    container = OmegaConf.to_container(conf)
    if container is None:
        return {}
    if not isinstance(container, dict):
        raise ConfigError(
            f"Config file '{path}' (from config=) holds a {type(container).__name__} at the top level; it must be a "
            "mapping of sections (data:, algorithm:, worker:, trainer:)."
        )
    return container


def load_config(argv: list[str]) -> PPOConfig:
    """Build the run configuration from command-line words.

    Args:
        argv: ``["config=path.yaml", "a.b=1", ...]``; ``config=`` is optional and may appear once.

    Returns:
        A finalized ``PPOConfig`` (auto keys filled in).

    Raises:
        ConfigError: unknown or auto key, malformed override, missing or malformed YAML file (not a mapping), value
            of the wrong type or out of range (``easyrl.config_checks``).
    """
    yaml_path = None
    overrides = []
    for word in argv:
        if "=" not in word:
            raise ConfigError(f"Command-line argument '{word}' is not of the form key=value (see --help).")
        if word.startswith("config="):
            yaml_path = word.split("=", 1)[1]
        else:
            overrides.append(word)

    valid, autos = _valid_keys(PPOConfig), _auto_keys(PPOConfig)
    merged = OmegaConf.structured(PPOConfig)
    layers = []
    if yaml_path is not None:
        if not os.path.isfile(yaml_path):
            raise ConfigError(f"Config file '{yaml_path}' (from config=) does not exist.")
        layers.append((_load_yaml(yaml_path), f"file {yaml_path}", None))
    for word in overrides:  # one word at a time, so that a grammar error names its word
        try:
            OmegaConf.from_dotlist([word])
        except Exception as e:  # omegaconf's / PyYAML's grammar errors
            reason = " ".join(str(e).strip().splitlines()[:2]).rstrip(".")
            raise ConfigError(f"Could not parse the command-line word '{word}': {reason}.") from None
    cli_conf = OmegaConf.from_dotlist(overrides)
    cli_whole_keys = {word.split("=", 1)[0] for word in overrides}
    layers.append((OmegaConf.to_container(cli_conf), "the command line", cli_whole_keys))

    free_dicts = [key for key, is_dict in valid.items() if is_dict]
    for layer, source, whole_keys in layers:
        layer = layer or {}
        _check_keys(layer, source, valid, autos)
        # A free-form dict given whole by a later layer replaces the earlier one instead of merging into it, so that
        # worker.reward.reward_function_kwargs={} really drops the YAML's kwargs. A YAML gives dicts whole; on the
        # command line only `key={...}` does, while `key.sub=value` merges into the dict.
        replaced = {key: _pop_dotted(layer, key) for key in free_dicts
                    if _has_dotted(layer, key) and (whole_keys is None or key in whole_keys)}
        try:
            merged = OmegaConf.merge(merged, layer)
            for key, value in replaced.items():
                if isinstance(value, dict):
                    OmegaConf.update(merged, key, value, merge=False)
                else:
                    raise ConfigError(f"'{key}' (from {source}) must be a mapping, got {value!r}.")
        except ConfigError:
            raise
        except Exception as e:  # type mismatch, e.g. a string for an int
            raise ConfigError(_merge_error(e, source)) from None
    config: PPOConfig = OmegaConf.to_object(merged)
    return config.finalize()


def to_dict(config: PPOConfig) -> dict:
    """The configuration as a plain nested dict (for logging and saving)."""
    return dataclasses.asdict(config)
