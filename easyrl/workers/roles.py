"""The model roles of one worker (:func:`build_roles`, called by ``FSDPWorker.init_models``), each a Hugging Face
model sharded with FSDP2 over all workers:

* ``actor``: the trained policy (``FSDPPolicy``); always built (frozen, alone, under ``trainer.val_only``).
* ``ref``: the frozen KL reference, copied from the actor's shards; only with ``algorithm.needs_reference`` and
  without LoRA (then the actor with its adapter off is the reference).
* ``critic``: the value model (``FSDPCritic``); only for ``algorithm.adv_estimator: gae``.
* ``reward_model``: a frozen ``FSDPRewardModel``; only with ``worker.reward.reward_model.model_path``.
* ``teachers``: the frozen distillation teachers (``FSDPPolicy`` each, in ``teachers_of`` order: one for
  ``worker.teacher``, one per ``worker.teachers`` entry); only when ``algorithm.needs_teacher``.

Built in this order on every rank together, so a role may start from an earlier one (``init_from``). Adding one:
docs/architecture.md.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Optional

import torch

from easyrl.config import PPOConfig
from easyrl.config.actor import Teacher, teachers_of


if TYPE_CHECKING:  # the model classes import transformers' models: only the workers build them (in build_roles)
    from torch.distributed.device_mesh import DeviceMesh

    from easyrl.workers.critic import FSDPCritic
    from easyrl.workers.policy import FSDPPolicy
    from easyrl.workers.reward_model import FSDPRewardModel


@dataclass
class Roles:
    """The sharded models of one worker; a role the run does not need is None."""

    actor: FSDPPolicy
    ref: Optional[FSDPPolicy] = None
    critic: Optional[FSDPCritic] = None
    reward_model: Optional[FSDPRewardModel] = None
    """The discriminative reward model (``worker.reward.reward_model``, frozen), when its ``model_path`` is set."""
    teachers: list[FSDPPolicy] = field(default_factory=list)
    """The distillation teachers, in ``teachers_of`` order (empty without distillation)."""


def build_roles(config: PPOConfig, mesh: DeviceMesh, device: str, torch_device: torch.device,
                training_steps: int = 0, seconds: Optional[dict[str, float]] = None) -> Roles:
    """Build the roles this run needs on every rank together (``mesh``: the 1-D data-parallel mesh;
    ``training_steps``: the LR schedules' length); ``seconds`` receives each role's build time by name.
    """
    from easyrl.workers.critic import FSDPCritic
    from easyrl.workers.policy import FSDPPolicy

    cfg = config.worker
    model_path = cfg.actor.model.model_path
    seconds = {} if seconds is None else seconds
    trainable = not config.trainer.val_only  # easyrl eval: the policy generates only (its weights reach vLLM)
    engine_len = cfg.rollout.max_model_len
    with timed(seconds, "actor"):
        actor = FSDPPolicy(model_path, cfg.actor, mesh, device, torch_device, trainable=trainable,
                           offload=cfg.actor.offload, training_steps=training_steps, engine_len=engine_len)
    ref = critic = reward_model = None
    teachers = []
    if trainable and config.builds_reference:
        with timed(seconds, "ref"):  # same checkpoint: copy the actor's shards (cast to the compute dtype)
            ref = FSDPPolicy(model_path, cfg.actor, mesh, device, torch_device, trainable=False,
                             offload=cfg.ref.offload, init_from=actor, engine_len=engine_len)
    if trainable and config.algorithm.needs_critic:
        with timed(seconds, "critic"):
            critic = FSDPCritic(cfg.critic.model.model_path, cfg.critic, mesh, device, torch_device,
                                 training_steps)
    if cfg.reward.reward_model.enabled:  # its own checkpoint and tokenizer; for easyrl eval too (validation scores)
        from easyrl.rewards.reward_model_inputs import load_tokenizer, padding_id
        from easyrl.workers.reward_model import FSDPRewardModel

        with timed(seconds, "reward_model"):
            reward_model = FSDPRewardModel(cfg.reward.reward_model, mesh, device, torch_device,
                                           padding_id(load_tokenizer(cfg.reward.reward_model)))
    if trainable and config.algorithm.needs_teacher:  # own checkpoints; the actor's sharding, never its LoRA
        with timed(seconds, "teacher"):  # all teachers together
            teachers = [FSDPPolicy(teacher.model.model_path, teacher_role_config(config, teacher), mesh, device,
                                   torch_device, trainable=False, offload=teacher.offload)
                        for teacher in teachers_of(cfg)]
    return Roles(actor=actor, ref=ref, critic=critic, reward_model=reward_model, teachers=teachers)


@contextmanager
def timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    """Record the block's wall-clock seconds in ``seconds[phase]`` (the start-up profile)."""
    began = time.time()
    yield
    seconds[phase] = time.time() - began


def teacher_role_config(config: PPOConfig, teacher: Teacher):
    """The role settings ``teacher``'s ``FSDPPolicy`` reads: ``worker.actor``'s (FSDP dtypes, padding-free, dynamic
    batching) with the teacher's ``model.trust_remote_code``. The actor's LoRA settings apply to trained roles
    only, so a frozen teacher never gets an adapter."""
    import copy

    role = copy.copy(config.worker.actor)
    role.model = copy.copy(role.model)
    role.model.trust_remote_code = teacher.model.trust_remote_code
    role.router_aux_loss_coef = 0.0  # a dense teacher beside a MoE student is fine: the teacher is never trained
    return role
