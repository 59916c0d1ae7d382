"""``worker.critic:``: the value model of PPO with GAE (built only for ``algorithm.adv_estimator: gae``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from easyrl.config.fields import POSITIVE
from easyrl.config.role import ModelConfig, OptimConfig, TrainedRoleConfig


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
