"""``PPOConfig``: the root of the configuration; ``finalize`` fills in the auto keys (``load_config`` then checks every
value and warns of traps, ``easyrl.config.checks``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from functools import reduce
from typing import Optional

from easyrl.config.algorithm import AlgorithmConfig
from easyrl.config.data import DataConfig
from easyrl.config.fields import auto_keys
from easyrl.config.placement import Placement, placement_of
from easyrl.config.trainer import TrainerConfig
from easyrl.config.worker import WorkerConfig


class OldLogProbs(str, Enum):
    """Where a step's old log-probs come from (``PPOConfig.old_log_probs_source``)."""

    ROLLOUT = "rollout"
    UPDATE = "update"
    RECOMPUTE = "recompute"


@dataclass
class PPOConfig:
    """The whole run configuration (the root of the YAML)."""

    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def finalize(self) -> "PPOConfig":
        """Fill in the auto keys, each from the source its field names (``auto``); returns ``self``."""
        for key, source in auto_keys(PPOConfig).items():
            if "/" not in source:  # trainer.run_dir joins two keys: below
                *section, name = key.split(".")
                setattr(reduce(getattr, section, self), name, reduce(getattr, source.split("."), self))
        critic_model = self.worker.critic.model
        critic_model.model_path = critic_model.model_path or self.worker.actor.model.model_path
        self.trainer.run_dir = os.path.join(
            self.trainer.runs_root, self.trainer.project_name, self.trainer.experiment_name
        )
        if self.trainer.save_checkpoint_path is None:
            self.trainer.save_checkpoint_path = self.trainer.run_dir
        return self

    @property
    def on_policy_update(self) -> bool:
        """Whether the update is provably on-policy, so the old-log-prob pass can be skipped: one epoch over one
        mini-batch (every forward runs before the only optimizer step, its detached log-probs are the old ones), and
        no importance sampling correction, in-reward KL or distillation, which need old log-probs before the update.
        """
        actor, algo = self.worker.actor, self.algorithm
        return (actor.ppo_epochs == 1 and actor.global_batch_size == self.data.rollout_batch_size
                and actor.tis_cap is None and actor.rollout_is is None and actor.rollout_rs is None
                and not (algo.use_kl_in_reward and not algo.disable_kl) and not algo.needs_teacher)

    def training_steps(self, n_prompts: int) -> int:
        """The run's number of steps for a training set of ``n_prompts`` prompts: ``trainer.total_epochs`` passes of
        ``n_prompts // data.rollout_batch_size`` steps (a short last batch is dropped), at most
        ``trainer.max_steps``. With ``data.mini_rollout_batch_size``: the prompts an epoch generates
        (whole generation batches) per rollout batch."""
        generated = n_prompts // self.data.generation_batch_size * self.data.generation_batch_size
        steps = generated // self.data.rollout_batch_size * self.trainer.total_epochs
        return steps if self.trainer.max_steps is None else min(steps, self.trainer.max_steps)

    def token_budget(self, micro: int, role=None) -> int:
        """Tokens one micro-batch of ``micro`` samples holds on one device: ``role.max_token_len_per_device`` (the
        actor's by default) or ``micro x (data.max_prompt_length + data.max_response_length)``, split over the
        ``worker.actor.ulysses_size`` devices of a sequence-parallel group."""
        role = role or self.worker.actor
        longest = self.data.max_prompt_length + self.data.max_response_length
        return role.max_token_len_per_device or -(-micro * longest // self.worker.actor.ulysses_size)

    def mini_batch_samples(self, role: str = "actor", rows: Optional[int] = None) -> int:
        """Samples one data-parallel group takes per optimizer step of ``role`` (``"actor"`` or ``"critic"``):
        ``worker.<role>.global_batch_size * worker.rollout.n`` over the :attr:`dp_size` groups (the devices of a
        sequence-parallel group share their samples). ``rows``: the group's share of this step's batch; its
        ``data.rollout_batch_size / global_batch_size`` mini-batches are then cut from those rows (rounded up), so
        that a batch with more rows than samples (an agent session's earlier segments, docs/agents.md) takes as many
        optimizer steps as the configuration says; for a share of ``rollout_batch_size * n / dp_size`` rows that is
        the same number."""
        if rows is not None:
            return -(-rows * getattr(self.worker, role).global_batch_size // self.data.rollout_batch_size)
        return getattr(self.worker, role).global_batch_size * self.worker.rollout.n // self.dp_size

    @property
    def placement(self) -> Placement:
        """Where the rollout engines run and how far ahead they generate (``trainer.rollout_mode``,
        ``easyrl.config.placement``)."""
        return placement_of(self)

    @property
    def uses_lora(self) -> bool:
        """Whether the actor carries a LoRA adapter (``worker.actor.model.lora.rank > 0``); the reference policy is then
        the actor with its adapter switched off, not a second model."""
        return self.worker.actor.model.lora.rank > 0

    @property
    def builds_reference(self) -> bool:
        """Whether a reference model is built: a KL term (loss or in-reward) uses the reference policy
        (``algorithm.needs_reference``) and the actor has no LoRA adapter (:attr:`uses_lora`)."""
        return self.algorithm.needs_reference and not self.uses_lora

    @property
    def old_log_probs_source(self) -> OldLogProbs:
        """Where a step's old log-probs ``(bsz, resp_len)`` come from: ``"rollout"`` with ``algorithm.bypass_mode``
        (vLLM's sampled-token log-probs, ``rollout_log_probs``; it wins over the on-policy shortcut, whose ratio
        would be against the actor's own log-probs), ``"update"`` when :attr:`on_policy_update` (the update's own
        detached log-probs), else ``"recompute"`` (the trainer's old-log-prob pass over the actor)."""
        if self.algorithm.bypass_mode:
            return OldLogProbs.ROLLOUT
        return OldLogProbs.UPDATE if self.on_policy_update else OldLogProbs.RECOMPUTE

    @property
    def sampling_mismatches(self) -> list[str]:
        """The rollout's sampling settings under which vLLM's log-probs are not of the distribution the actor scores
        (``key=value (why)``, one each; empty when they are): top-p or top-k truncation (vLLM reports the truncated
        distribution's log-probs, the actor the full one's), greedy decoding (temperature 0), or an actor temperature
        other than the rollout's."""
        rollout, actor = self.worker.rollout, self.worker.actor
        found = []
        if rollout.top_p < 1.0:
            found.append(f"worker.rollout.top_p={rollout.top_p} (nucleus truncation)")
        if rollout.top_k > 0:
            found.append(f"worker.rollout.top_k={rollout.top_k} (top-k truncation)")
        if rollout.temperature == 0:
            found.append("worker.rollout.temperature=0 (greedy: no sampling distribution)")
        elif actor.temperature != rollout.temperature:
            found.append(f"worker.actor.temperature={actor.temperature} (the rollout samples at "
                         f"worker.rollout.temperature={rollout.temperature})")
        return found

    @property
    def sync_check_off(self) -> list[str]:
        """Why the weight-sync check (``worker.actor.rollout_sync_threshold``) does not apply, one phrase per reason
        ([]: it applies). It needs vLLM's log-probs kept, of the distribution the actor scores (no
        :attr:`sampling_mismatches`), by the weights the actor holds (``trainer.rollout_mode: colocated``, also when a
        replay's dump was; split they are older), and log-probs of the actor's to compare them with (not
        ``algorithm.bypass_mode``)."""
        rollout, reasons = self.worker.rollout, []
        if not rollout.calculate_log_probs:
            reasons.append("worker.rollout.calculate_log_probs=false keeps no vLLM log-probs to compare")
        if self.algorithm.bypass_mode:
            reasons.append("algorithm.bypass_mode=true takes vLLM's log-probs as the old ones: no actor pass computes "
                           "log-probs to compare them with")
        if self.placement.max_staleness != 0:  # a replay: as the dumped run's mode says
            reasons.append(f"the rollout samples with weights up to {self.placement.max_staleness} step(s) older "
                           f"than the actor's (trainer.rollout_mode={self.trainer.rollout_mode}, or the replayed "
                           "dump's)")
        reasons += [f"{mismatch}: vLLM's log-probs are of another distribution than the actor's"
                    for mismatch in self.sampling_mismatches] if rollout.calculate_log_probs else []
        return reasons

    @property
    def sync_check_threshold(self) -> Optional[float]:
        """``worker.actor.rollout_sync_threshold`` where the weight-sync check applies (:attr:`sync_check_off` is
        empty); else None."""
        return None if self.sync_check_off else self.worker.actor.rollout_sync_threshold

    @property
    def world_size(self) -> int:
        """Number of workers (devices): ``trainer.nnodes * trainer.n_gpus_per_node``."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

    @property
    def dp_size(self) -> int:
        """Data-parallel groups (each gets its own share of a batch): ``world_size / worker.actor.ulysses_size``."""
        return self.world_size // self.worker.actor.ulysses_size
