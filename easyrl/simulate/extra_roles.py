"""The roles beside the actor, reference and critic, simulated with easyrl's own worker code as rank 0 of the fake
world (docs/simulate.md, "The roles beside the actor"): the reward model's load and forward (as
``FSDPWorker.compute_rm_scores``), the distillation teacher's load and log-prob forward (as
``FSDPWorker.compute_teacher_log_probs``), and the LLM judge's vLLM engine, not simulated but held beside every
phase (its ``gpu_memory_utilization`` claim; its weights must fit in it).
"""

from __future__ import annotations

import copy
from typing import Callable
from unittest import mock

import torch

from easyrl.config import PPOConfig
from easyrl.simulate.fake_device import GIB, fake_state

JUDGE = "judge vLLM (worker.reward.judge.gpu_memory_utilization)"


class _FakeLoaded:
    """What ``from_pretrained`` returns to ``FSDPRewardModel`` on rank 0: a state dict and buffers of fake tensors."""

    def __init__(self, hf_config):
        from easyrl.sizing.anatomy import meta_model

        self.state, self.buffers = fake_state(meta_model(hf_config, classifier=True))

    def state_dict(self):
        return self.state

    def named_buffers(self):
        return iter(self.buffers.items())


def reward_model_batch(config: PPOConfig):
    """One micro-batch of reward-model inputs: ``micro_batch_size_per_device`` rows of ``max_length`` (or the
    sample's padded length, ``max_prompt_length + max_response_length``) tokens, right-padded host tensors."""
    from tensordict import TensorDict

    from easyrl.batch import Batch

    rm = config.worker.reward.reward_model
    length = rm.max_length or config.data.max_prompt_length + config.data.max_response_length
    rows = rm.micro_batch_size_per_device
    return Batch(TensorDict({"input_ids": torch.randint(0, 1000, (rows, length)),
                             "attention_mask": torch.ones(rows, length, dtype=torch.long)}, batch_size=[rows]))


def reward_model_phases(config: PPOConfig, mesh, kind: str, device: torch.device, phase: Callable,
                        folder: Callable[[str], str], batch) -> None:
    """``load reward model`` (``FSDPRewardModel`` with its offload setting, rank 0's checkpoint read faked) and
    ``reward model forward`` (one micro-batch of ``compute_scores``); ``batch`` from
    :func:`reward_model_batch`, made before the fake mode (the trainer sends host tensors)."""
    from transformers import AutoModelForSequenceClassification

    from easyrl.workers.reward_model import FSDPRewardModel

    rm = copy.copy(config.worker.reward.reward_model)  # model_path: the folder holding its config.json
    rm.model_path = folder(rm.model_path)
    loaded = staticmethod(lambda path, config=None, **kwargs: _FakeLoaded(config))
    with mock.patch.object(AutoModelForSequenceClassification, "from_pretrained", loaded):
        model = phase("load reward model", lambda: FSDPRewardModel(rm, mesh, kind, device, pad_id=0))
    phase("reward model forward", lambda: model.compute_scores(batch))


def teacher_phases(config: PPOConfig, mesh, kind: str, device: torch.device, phase: Callable,
                   folder: Callable[[str], str], batch) -> None:
    """``load teacher`` (``FSDPPolicy`` with ``teacher_role_config``, offloaded as configured) and ``teacher
    forward`` (its log-probs); ``batch``: the actor's experience micro-batch."""
    from easyrl.workers.policy import FSDPPolicy
    from easyrl.workers.roles import teacher_role_config

    cfg = config.worker
    teacher = phase("load teacher", lambda: FSDPPolicy(folder(cfg.teacher.model.model_path),
                                                       teacher_role_config(config), mesh, kind, device,
                                                       trainable=False, offload=cfg.teacher.offload))
    phase("teacher forward", lambda: teacher.compute_log_probs(
        batch, cfg.teacher.micro_batch_size_per_device_for_experience, cfg.actor.temperature))


def judge_engine(config: PPOConfig, capacity_gib: float, folder: Callable[[str], str]) -> dict[str, float]:
    """The judge's vLLM engine (empty without one): ``claim_gib`` (``judge.gpu_memory_utilization x`` the device,
    resident beside every phase) and ``weights_gib`` (its parameters in ``worker.rollout.dtype``: one engine per
    device, no tensor parallelism)."""
    judge = config.worker.reward.judge
    if judge.model_path is None:
        return {}
    from transformers import AutoConfig

    from easyrl.sizing.anatomy import DTYPE_BYTES, count_parameters

    hf_config = AutoConfig.from_pretrained(folder(judge.model_path))
    params, _ = count_parameters(hf_config)
    return {"claim_gib": judge.gpu_memory_utilization * capacity_gib,
            "weights_gib": params * DTYPE_BYTES[config.worker.rollout.dtype] / GIB}

