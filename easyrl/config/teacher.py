"""``worker.teacher``: the frozen teacher of on-policy distillation (``algorithm.distill_coef``,
``algorithm.adv_estimator: on_policy_distill``; docs/distillation.md): a second checkpoint, sharded and offloaded like
the reference policy, scoring the student's sampled tokens; and the checks of the distillation settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from easyrl.config.fields import auto
from easyrl.config.role import OffloadConfig
from easyrl.errors import ConfigError


@dataclass
class TeacherModelConfig:
    """The teacher's checkpoint. Its tokenizer must be the student's (same ids for the same tokens, same special
    tokens and chat template): checked before the workers start (``easyrl.trainer.model_checks``)."""

    model_path: Optional[str] = None
    """A hub id or local folder in Hugging Face format (a causal LM), e.g. Qwen/Qwen3-8B for a Qwen3-1.7B student."""
    tokenizer_path: Optional[str] = None
    """Defaults to ``model_path``; only read for the compatibility check."""
    trust_remote_code: bool = False


@dataclass
class TeacherConfig:
    """The frozen teacher model (built only when ``algorithm.needs_teacher``)."""

    model: TeacherModelConfig = field(default_factory=TeacherModelConfig)
    offload: OffloadConfig = field(default_factory=lambda: OffloadConfig(offload_params=True))
    """As ``worker.ref.offload``: the teacher's shard stays on the host and is brought to the device block by
    block for its pass (ignored on the CPU)."""
    micro_batch_size_per_device_for_experience: int = auto(
        "worker.actor.micro_batch_size_per_device_for_experience", 16)


def check_distillation(config: Any) -> None:
    """The distillation settings of a finalized ``PPOConfig``: a teacher checkpoint when distillation is on, and one way
    of mixing (the pure estimator ``on_policy_distill`` or a coefficient on another estimator, not both). Raises
    ``ConfigError`` naming the key, the value and what to write instead."""
    algo, teacher = config.algorithm, config.worker.teacher
    pure = algo.estimator("needs_teacher")
    if pure and algo.distill_coef > 0:
        raise ConfigError(
            f"algorithm.adv_estimator={algo.adv_estimator} is pure distillation (advantage = -reverse KL) and "
            f"algorithm.distill_coef={algo.distill_coef} would add the reverse KL a second time: set "
            "algorithm.distill_coef=0, or choose an RL estimator (e.g. grpo) to mix it with the RL advantage.")
    if algo.needs_teacher and not teacher.model.model_path:
        why = f"algorithm.adv_estimator={algo.adv_estimator}" if pure else f"algorithm.distill_coef={algo.distill_coef}"
        raise ConfigError(f"{why} distills from a teacher, but worker.teacher.model.model_path is not set: give the "
                          "teacher's hub id or local folder (it must share the actor's tokenizer).")
