"""``worker.critic:``: the value model of PPO with GAE (built only for ``algorithm.adv_estimator: gae``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from easyrl.config.actor import FSDPConfig, ModelConfig, OffloadConfig, OptimConfig


@dataclass
class CriticConfig:
    """The value model of PPO with GAE (``algorithm.adv_estimator: gae``; EasyR1's ``worker.critic``): the policy's
    model class with its LM head replaced by a zero-initialised scalar value head, FSDP2-sharded like the actor and
    fed through the same (padding-free) forward."""

    global_batch_size: int = 256
    """Prompts per critic optimizer step."""
    micro_batch_size_per_device_for_update: int = 4
    micro_batch_size_per_device_for_experience: int = 16
    """Samples per forward when computing the values of a rollout batch."""
    max_grad_norm: float = 1.0
    cliprange_value: float = 0.5
    """New values stay within this distance of the rollout's values in the loss (PPO value clipping)."""
    loss_agg_mode: str = "token-mean"
    """How the per-token value loss is aggregated; the same modes as ``worker.actor.loss_agg_mode``."""
    ppo_epochs: int = 1
    padding_free: bool = True
    dynamic_batching: bool = True
    max_token_len_per_device: Optional[int] = None
    max_consecutive_skips: int = 5
    model: ModelConfig = field(default_factory=ModelConfig)
    """``model_path`` null = the actor's checkpoint (the usual choice); LoRA is not supported (rank must be 0)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
