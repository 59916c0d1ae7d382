"""The whole run configuration: plain dataclasses, one module per section (docs/config.md), merged as dataclass
defaults <- the YAML named by ``config=`` <- dotted CLI overrides by ``load_config``, e.g.::

    python -m easyrl.trainer config=config.yaml data.max_prompt_length=1024 worker.rollout.n=8

Batch sizes are counted in prompts; each prompt is sampled ``worker.rollout.n`` times. Auto keys (``auto``) follow from
others and cannot be set. Modules of the package import each other directly, never through ``easyrl.config``.
"""

from __future__ import annotations

from easyrl.config.actor import ActorConfig, RefConfig, TeacherConfig, TeacherModelConfig
from easyrl.config.algorithm import AlgorithmConfig
from easyrl.config.data import DataConfig
from easyrl.config.fields import auto, auto_keys, valid_keys
from easyrl.config.loading import load_config, to_dict
from easyrl.config.ppo import PPOConfig
from easyrl.config.role import (CriticConfig, FSDPConfig, LoraConfig, ModelConfig, OffloadConfig, OptimConfig,
                                TrainedRoleConfig)
from easyrl.config.trainer import TrainerConfig
from easyrl.config.worker import RewardConfig, RewardModelConfig, RolloutConfig, WorkerConfig
from easyrl.errors import ConfigError

__all__ = [
    "ActorConfig", "AlgorithmConfig", "ConfigError", "CriticConfig", "DataConfig", "FSDPConfig", "LoraConfig",
    "ModelConfig", "OffloadConfig", "OptimConfig", "PPOConfig", "RefConfig", "RewardConfig", "RewardModelConfig",
    "RolloutConfig", "TeacherConfig", "TeacherModelConfig", "TrainedRoleConfig", "TrainerConfig", "WorkerConfig",
    "auto", "auto_keys", "load_config", "to_dict", "valid_keys",
]
