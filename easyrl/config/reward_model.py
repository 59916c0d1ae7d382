"""``worker.reward.reward_model``: a discriminative reward model (a Hugging Face sequence-classification checkpoint
with one output, e.g. Skywork-Reward-V2-Qwen3) scoring every (prompt, response) on the workers, mixed with the rule
reward as a named score (docs/rewards.md). The responses are decoded with the policy's tokenizer, then re-encoded with
the reward model's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Optional

from easyrl.config.fields import POSITIVE, auto
from easyrl.config.role import OffloadConfig
from easyrl.errors import ConfigError

__all__ = ["RewardModelConfig", "check_reward_model"]


@dataclass
class RewardModelConfig:
    """A frozen sequence-classification model (``AutoModelForSequenceClassification``, ``num_labels: 1``), FSDP2-sharded
    over the workers like the reference policy; its score of each sample is ``score/reward_model`` and adds
    ``weight x score`` to the sample's reward (``overall``)."""

    model_path: Optional[str] = None
    """A hub id or local folder of the reward model; null: no reward model."""
    tokenizer_path: Optional[str] = None
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
    chat_template: Optional[str] = None
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
    Raises ``ConfigError`` naming the key: an empty ``chat_template``, or an estimator whose greedy baselines the rule
    reward alone scores (ReMax)."""
    rm = config.worker.reward.reward_model
    if not rm.enabled:
        return
    key = "worker.reward.reward_model"
    if rm.chat_template is not None and not rm.chat_template.strip():
        raise ConfigError(f"{key}.chat_template is empty: give a Jinja template or a file holding one, or null for the "
                          "reward model tokenizer's own.")
    if config.algorithm.estimator("needs_reward_baselines"):
        raise ConfigError(f"{key}.model_path is set with algorithm.adv_estimator={config.algorithm.adv_estimator}: "
                          "its greedy baseline is scored by the rule reward only; use grpo (or another estimator) "
                          "with a reward model.")


def read_chat_template(value: Optional[str]) -> Optional[str]:
    """``worker.reward.reward_model.chat_template`` as a Jinja string: the file's text when it names a file, else
    the value itself (None stays None)."""
    if value is not None and os.path.isfile(os.path.expanduser(value)):
        with open(os.path.expanduser(value), encoding="utf-8") as f:
            return f.read()
    return value
