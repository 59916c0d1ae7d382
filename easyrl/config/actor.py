"""``worker.actor`` and ``worker.ref``: the FSDP2-trained policy (its policy loss and KL/entropy terms, on top of
``TrainedRoleConfig``'s model, optimizer, FSDP, offloading and batch sizes) and the frozen reference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from easyrl.config.fields import auto
from easyrl.config.role import OffloadConfig, TrainedRoleConfig


@dataclass
class ActorConfig(TrainedRoleConfig):
    """The trained policy: batch sizes (mini-batch in prompts, micro-batches in samples), policy loss, KL/entropy
    terms."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.3
    clip_ratio_dual: float = 3.0
    loss_type: str = "vanilla"
    """Policy loss: vanilla (PPO clip, dual-clip), gspo, cispo, sapo."""
    tau_positive: float = 1.0
    """SAPO gate temperature for tokens with a positive advantage (``loss_type: sapo``)."""
    tau_negative: float = 1.05
    """SAPO gate temperature for tokens with a zero or negative advantage (``loss_type: sapo``)."""
    entropy_coeff: float = 0.0
    router_aux_loss_coef: float = 0.0
    """MoE models (Qwen3-MoE, Qwen3-VL-MoE, Qwen3.5-MoE, ...): weight of the router's load-balancing loss (Switch
    Transformer, Fedus et al. 2022, arXiv:2101.03961, Eq. 4-6, as transformers computes it over every token of a
    micro-batch) added to the actor's loss, logged as ``actor/router_aux_loss``. 0 (default, as verl's FSDP actor):
    not computed. The released Qwen3-MoE checkpoints were pre-trained with 0.001."""
    tis_cap: Optional[float] = None
    """Truncated importance sampling cap against vLLM's sampled-token log-probs; None disables it."""
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
    micro_batch_size_per_device_for_experience: int = auto(
        "worker.actor.micro_batch_size_per_device_for_experience", 16)
