"""The whole run configuration: plain dataclasses, merged by OmegaConf.

Precedence (later wins): dataclass defaults <- the YAML named by ``config=`` <- dotted CLI overrides, e.g.::

    python -m easyrl.trainer config=config.yaml data.max_prompt_length=1024 worker.rollout.n=8

Semantics follow EasyR1: batch sizes are counted in prompts (``data.rollout_batch_size``,
``worker.actor.global_batch_size``); each prompt is sampled ``worker.rollout.n`` times inside. Values that follow
from others ("auto keys", marked ``metadata={"auto": ...}``) are filled in by ``PPOConfig.finalize`` and cannot be set
by users: setting one fails and names the key to set instead. An unknown key fails before any work starts, naming the
key and the closest valid ones.

One module per section: ``data``, ``algorithm``, ``actor`` (``worker.actor``/``worker.ref``), ``critic``
(``worker.critic``), ``worker``
(rollout, reward, the worker section), ``trainer``, ``ppo`` (the root); ``loading`` builds a config from the
command line. Every name is importable from ``easyrl.config``.
"""

from __future__ import annotations

from easyrl.config.actor import ActorConfig, FSDPConfig, LoraConfig, ModelConfig, OffloadConfig, OptimConfig, RefConfig
from easyrl.config.algorithm import AlgorithmConfig
from easyrl.config.critic import CriticConfig
from easyrl.config.data import DataConfig
from easyrl.config.fields import auto
from easyrl.config.loading import _auto_keys, _valid_keys, load_config, to_dict
from easyrl.config.ppo import PPOConfig
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
    "RolloutConfig",
    "TrainerConfig",
    "WorkerConfig",
    "_auto_keys",
    "_valid_keys",
    "auto",
    "load_config",
    "to_dict",
]
