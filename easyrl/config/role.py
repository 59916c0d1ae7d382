"""An FSDP2-trained model role: its checkpoint (and LoRA), optimizer, FSDP sharding, host offloading, batch sizes and
update loop, the fields the actor and the critic share (``TrainedRoleConfig``); and ``worker.critic:``, the value model
of PPO with GAE (built only for ``algorithm.adv_estimator: gae``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Literal, NamedTuple, Optional

from annotated_types import Interval

from easyrl.config.fields import NON_NEGATIVE, POSITIVE, UNIT, input_path, registered
from easyrl.errors import ConfigError



class DtypeSpec(NamedTuple):
    """What a dtype the config names is."""

    torch_name: str
    """torch's and vLLM's name (``torch.bfloat16``, ``vllm.LLM(dtype="bfloat16")``)."""
    bytes: int
    """Bytes per element."""


DTYPES = {"bf16": DtypeSpec("bfloat16", 2), "fp16": DtypeSpec("float16", 2), "fp32": DtypeSpec("float32", 4)}
"""The dtypes a config may name -> what each is: the one table (``easyrl.workers.fsdp_model.TORCH_DTYPES`` and
``easyrl.sizing.anatomy.DTYPE_BYTES`` are views of it)."""
Dtype = Literal[tuple(DTYPES)]  # type: ignore[valid-type]  # the keys of DTYPES
BETA = Annotated[float, Interval(ge=0, lt=1)]


@dataclass
class LoraConfig:
    """LoRA with peft (``easyrl/models/lora.py``). Only the adapter is trained; the reference policy is
    the base model (the adapter switched off); vLLM receives the merged weights ``W + alpha / rank * B @ A``."""

    rank: Annotated[int, NON_NEGATIVE] = 0
    """Rank of the adapter matrices; 0 = LoRA off (full fine-tuning)."""
    alpha: Annotated[float, POSITIVE] = 64
    """The adapter's output is scaled by ``alpha / rank``."""
    target_modules: str = "all-linear"
    """``all-linear`` (every linear layer but the output head) or comma-separated module names
    (``q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj``)."""
    exclude_modules: Optional[str] = ".*visual.*"
    """A regular expression of full module names left without adapter; by default the vision tower of Qwen-VL
    models (``model.visual``); a family whose tower is named otherwise is refused with its pattern before Ray
    (docs/errors.md, M30). null: none."""

    def check(self, key: str) -> None:
        """When LoRA is on (``rank > 0``): some module names to target, and an exclude pattern that is a valid regular
        expression (peft matches it against full module names). Raises ``ConfigError`` naming ``key``.``<field>``."""
        if self.rank == 0:
            return
        if not str(self.target_modules).strip(" ,"):
            raise ConfigError(f"{key}.target_modules is empty: give 'all-linear' or comma-separated module names "
                              "(q_proj,k_proj,v_proj,o_proj).")
        if self.exclude_modules:
            try:
                re.compile(self.exclude_modules)
            except re.error as err:
                raise ConfigError(f"{key}.exclude_modules={self.exclude_modules!r} is not a regular expression "
                                  f"({err}); e.g. '.*visual.*' leaves the vision tower without adapter.") from None


@dataclass
class ModelConfig:
    """The policy checkpoint (actor, reference and rollout all start from it)."""

    model_path: Optional[str] = input_path()
    """A hub id or local folder in Hugging Face format."""
    tokenizer_path: Optional[str] = input_path()
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

    lr: Annotated[float, NON_NEGATIVE] = 1e-6
    betas: tuple[BETA, BETA] = (0.9, 0.999)
    weight_decay: Annotated[float, NON_NEGATIVE] = 1e-2
    lr_warmup_ratio: Annotated[float, UNIT] = 0.0
    """Fraction of the run's steps (``PPOConfig.training_steps``) with a linear warm-up; constant afterwards."""
    strategy: Literal["adamw", "adamw_bf16"] = "adamw"
    """adamw (float32 moments) or adamw_bf16 (bfloat16 moments: 4 bytes per parameter instead of 8)."""
    lr_warmup_steps: Optional[Annotated[int, NON_NEGATIVE]] = None
    """Warm-up length in optimizer steps; when set it wins over ``lr_warmup_ratio``."""
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    """After the warm-up: constant, or cosine (a half cosine from ``lr`` down to ``min_lr_ratio * lr`` at
    the run's last step); ``easyrl.workers.optim.lr_factor``."""
    min_lr_ratio: Optional[Annotated[float, UNIT]] = None
    """Cosine schedule only: the final LR as a fraction of ``lr`` (None: 0)."""


@dataclass
class FSDPConfig:
    """FSDP2 (``fully_shard``) settings: mixed precision, activation checkpointing, resharding."""

    param_dtype: Dtype = "bf16"
    """Compute dtype of the sharded parameters (bf16, fp16 or fp32); fp32 on the CPU."""
    reduce_dtype: Dtype = "fp32"
    enable_gradient_checkpointing: bool = True
    reshard_after_forward: bool = True
    torch_dtype: Optional[Dtype] = None
    """dtype of a trained role's stored (master) weights, and so of its gradients and AdamW moments: None = fp32;
    bf16 halves that memory (with ``optim.strategy: adamw_bf16`` for 30B+ models)."""


@dataclass
class OffloadConfig:
    """Host offloading of a sharded model."""

    offload_params: bool = False
    """Keep parameters (and with them gradients and optimizer states: FSDP2's ``CPUOffloadPolicy``) on the host;
    they are copied to the device block by block when used. Ignored on the CPU."""


@dataclass
class TrainedOffloadConfig(OffloadConfig):
    """Host offloading of a trained model: its parameters, and apart from them its optimizer states."""

    offload_optimizer: bool = False
    """Without ``offload_params``: keep the optimizer states (AdamW's moments) on the host between updates, moved to
    the device for each update and checkpoint; with ``offload_params`` they are on the host anyway. Ignored on the
    CPU."""


@dataclass
class TrainedRoleConfig:
    """What the actor and the critic share as models trained with FSDP2 on the rollout batch: batch sizes
    (mini-batch in prompts, micro-batches in samples), the update loop, the checkpoint, optimizer, sharding and
    offloading. Extended by ``ActorConfig`` and ``CriticConfig``."""

    global_batch_size: Annotated[int, POSITIVE] = 256
    """Prompts per optimizer step (a mini-batch); the rollout batch is split into such mini-batches."""
    micro_batch_size_per_device_for_update: Annotated[int, POSITIVE] = 4
    """Samples per forward/backward on one device."""
    micro_batch_size_per_device_for_experience: Annotated[int, POSITIVE] = 16
    """Samples per forward over a rollout batch: the actor's old/ref log-probs, the critic's values."""
    max_grad_norm: Annotated[float, POSITIVE] = 1.0
    loss_agg_mode: Annotated[str, registered("easyrl.algorithms.loss_agg", "LOSS_AGG_MODES")] = "token-mean"
    """How the per-token loss (the policy loss, the critic's value loss) is aggregated (docs/algorithms.md)."""
    ppo_epochs: Annotated[int, POSITIVE] = 1
    padding_free: bool = True
    """Pack each micro-batch's sequences into one row without padding (per-sequence positions, varlen attention,
    no full-vocabulary logits); false runs the padded batch with an attention mask. Fixed at start-up."""
    dynamic_batching: bool = True
    """Form micro-batches by a token budget (``max_token_len_per_device``) instead of a fixed sample count; the
    loss normalisation over the mini-batch is unchanged."""
    max_token_len_per_device: Optional[Annotated[int, POSITIVE]] = None
    """Tokens (prompt + response, no padding) per micro-batch with ``dynamic_batching``; None: the phase's
    ``micro_batch_size_per_device_for_*`` x (``data.max_prompt_length`` + ``data.max_response_length``)."""
    max_consecutive_skips: int = 5
    """An optimizer step whose gradient norm is NaN/inf is skipped (counted as ``actor/skipped_steps``,
    ``critic/skipped_steps``); this many skips in a row stop the run with an error (<= 0: never)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    offload: TrainedOffloadConfig = field(default_factory=TrainedOffloadConfig)


@dataclass
class CriticConfig(TrainedRoleConfig):
    """The value model of PPO with GAE (``algorithm.adv_estimator: gae``): the policy's
    model class with its LM head replaced by a zero-initialised scalar value head, FSDP2-sharded like the actor and
    fed through the same (padding-free) forward."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """``model_path`` null = the actor's checkpoint (the usual choice); LoRA is not supported (rank must be 0)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    cliprange_value: Annotated[float, POSITIVE] = 0.5
    """New values stay within this distance of the rollout's values in the loss (PPO value clipping)."""
