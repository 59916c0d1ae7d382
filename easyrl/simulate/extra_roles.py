"""The roles beside the actor, reference and critic (docs/simulate.md, "The roles beside the actor"): the reward
model's and the distillation teacher's load and forward (the LLM judge's vLLM engine: ``Simulation.beside``)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Callable
from unittest import mock

import torch

from easyrl.config import PPOConfig
from easyrl.simulate.fake_device import fake_state
from easyrl.sizing.anatomy import meta_model


def reward_model_batch(config: PPOConfig):
    """One micro-batch of reward-model inputs: ``micro_batch_size_per_device`` host rows of ``max_length`` (or prompt
    + response) tokens."""
    from tensordict import TensorDict

    from easyrl.batch import Batch

    rm = config.worker.reward.reward_model
    length = rm.max_length or config.data.max_prompt_length + config.data.max_response_length
    rows = rm.micro_batch_size_per_device
    return Batch(TensorDict({"input_ids": torch.randint(0, 1000, (rows, length)),
                             "attention_mask": torch.ones(rows, length, dtype=torch.long)}, batch_size=[rows]))


def reward_model_phases(config: PPOConfig, mesh, kind: str, device: torch.device, phase: Callable,
                        folder: Callable[[str], str], batch) -> None:
    """``load reward model`` and ``reward model forward`` (``compute_scores`` of ``batch``:
    :func:`reward_model_batch`, made before the fake mode)."""
    from transformers import AutoModelForSequenceClassification

    from easyrl.workers.reward_model import FSDPRewardModel

    rm = copy.copy(config.worker.reward.reward_model)  # model_path: the folder holding its config.json
    rm.model_path = folder(rm.model_path)

    def loaded(path, **kwargs):  # from_pretrained's model on rank 0: a fake state dict and buffers
        state, buffers = fake_state(meta_model(kwargs["config"], classifier=True))
        return SimpleNamespace(state_dict=lambda: state, named_buffers=lambda: iter(buffers.items()))

    with mock.patch.object(AutoModelForSequenceClassification, "from_pretrained", staticmethod(loaded)):
        model = phase("load reward model", lambda: FSDPRewardModel(rm, mesh, kind, device, pad_id=0))
    phase("reward model forward", lambda: model.compute_scores(batch))


def teacher_phases(config: PPOConfig, mesh, kind: str, device: torch.device, phase: Callable,
                   folder: Callable[[str], str], batch) -> None:
    """``load teacher`` and ``teacher forward`` (its log-probs of ``batch``)."""
    from easyrl.workers.policy import FSDPPolicy
    from easyrl.workers.roles import teacher_role_config

    cfg = config.worker
    teacher = phase("load teacher", lambda: FSDPPolicy(folder(cfg.teacher.model.model_path),
                                                       teacher_role_config(config), mesh, kind, device,
                                                       trainable=False, offload=cfg.teacher.offload))
    phase("teacher forward", lambda: teacher.compute_log_probs(
        batch, cfg.teacher.micro_batch_size_per_device_for_experience, cfg.actor.temperature))
