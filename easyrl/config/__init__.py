"""The whole run configuration: plain dataclasses, merged by OmegaConf.

Precedence (later wins): dataclass defaults <- the YAML named by ``config=`` <- dotted CLI overrides, e.g.::

    python -m easyrl.trainer config=config.yaml data.max_prompt_length=1024 worker.rollout.n=8

Semantics follow EasyR1: batch sizes are counted in prompts (``data.rollout_batch_size``,
``worker.actor.global_batch_size``); each prompt is sampled ``worker.rollout.n`` times inside. Values that follow
from others ("auto keys", marked ``metadata={"auto": ...}``) are filled in by ``PPOConfig.finalize`` and cannot be set
by users: setting one fails and names the key to set instead. An unknown key fails before any work starts, naming the
key and the closest valid ones.

One module per section: ``data``, ``algorithm``, ``role`` (what the actor and the critic share: model, optimizer,
FSDP, offloading, batch sizes), ``actor`` (``worker.actor``/``worker.ref``), ``critic`` (``worker.critic``),
``worker`` (rollout, reward, the worker section), ``trainer`` (and the metric backends), ``ppo`` (the root);
``loading`` builds a config from the command line, ``checks`` checks its values and ``traps`` warns of settings that
differ from their paper's meaning. Every config class and ``load_config`` are importable from ``easyrl.config``; the
checks and warnings from their modules. Modules inside the package import each other directly, never through
``easyrl.config``, so the package has no import cycle.
"""

from __future__ import annotations

from easyrl.config.actor import ActorConfig, RefConfig
from easyrl.config.algorithm import AlgorithmConfig
from easyrl.config.critic import CriticConfig
from easyrl.config.data import DataConfig
from easyrl.config.fields import auto
from easyrl.config.loading import auto_keys, load_config, to_dict, valid_keys
from easyrl.config.ppo import PPOConfig
from easyrl.config.reward_model import RewardModelConfig
from easyrl.config.role import FSDPConfig, LoraConfig, ModelConfig, OffloadConfig, OptimConfig, TrainedRoleConfig
from easyrl.config.trainer import TrainerConfig
from easyrl.config.worker import RewardConfig, RolloutConfig, WorkerConfig
from easyrl.errors import ConfigError

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "FSDPConfig",
    "LoraConfig",
    "ModelConfig",
    "OffloadConfig",
    "OptimConfig",
    "PPOConfig",
    "RefConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "TrainedRoleConfig",
    "TrainerConfig",
    "WorkerConfig",
    "auto",
    "auto_keys",
    "load_config",
    "to_dict",
    "valid_keys",
]
