"""``RayPPOTrainer``: the training loop, read top to bottom as the algorithm.

Each step: generate -> reward -> old log-prob -> ref log-prob -> values (with a critic) -> advantage -> update critic
-> update actor, every phase timed (``timing_s/<phase>``). The trainer process (the Ray driver) holds the batch and the
reward function; the workers (one Ray actor per device) hold the FSDP2 actor, the reference policy, the critic (PPO
with GAE) and a vLLM engine each.

The phases around the loop live in their own modules, mixed into ``RayPPOTrainer``: ``generation`` (prompt batches,
vLLM generation, dynamic sampling, ReMax baselines), ``scoring`` (the reward function), ``validation``, and
``checkpoint`` (save/resume); ``batch_layout`` holds the padded layout, ``metrics`` the metric names and timers.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import OmegaConf

from easyrl.algorithms.advantages import get_adv_estimator
from easyrl.algorithms.kl import apply_kl_penalty, make_kl_controller
from easyrl.batch import Batch
from easyrl.config import PPOConfig, to_dict
from easyrl.data.dataset import collate_fn
from easyrl.data.loader import PromptStream
from easyrl.rewards.function import RewardFunction
from easyrl.rewards.guard import GuardedReward
from easyrl.trainer.batch_layout import for_workers
from easyrl.trainer.checkpoint import CheckpointMixin
from easyrl.trainer.flops import ModelShape, compute_mfu_metrics, peak_flops
from easyrl.trainer.generation import GenerationMixin
from easyrl.trainer.loggers import Tracker
from easyrl.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    constant_reward_warning,
    constant_rewards_began,
    frac_reward_zero_std,
    reduce_metrics,
    rollout_mismatch_metrics,
    timer,
)
from easyrl.trainer.scoring import ScoringMixin
from easyrl.trainer.signals import GracefulStop
from easyrl.trainer.validation import ValidationMixin
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.group import WorkerError, WorkerGroup
from easyrl.workers.mm_staging import has_multi_modal, stage_references, staging_batch
from easyrl.workers.seqlen_balancing import balanced_rank_order

logger = logging.getLogger("easyrl.trainer")


class RayPPOTrainer(GenerationMixin, ScoringMixin, ValidationMixin, CheckpointMixin):
    """Runs GRPO-style RL: see the module docstring for the phases.

    Args:
        config: finalized configuration.
        tokenizer: the actor's tokenizer (pad id, decoding responses for the reward).
        train_dataset, val_dataset: ``RLDataset``s.
        reward_fn, val_reward_fn: ``RewardFunction``s (may be the same object).
    """

    def __init__(self, config: PPOConfig, tokenizer, train_dataset, val_dataset, reward_fn: RewardFunction,
                 val_reward_fn: Optional[RewardFunction] = None):
        self.config = config
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn or reward_fn
        reward_cfg = config.worker.reward
        self._guard = GuardedReward(reward_fn, reward_cfg.on_error, reward_cfg.timeout_s)
        self._val_guard = (self._guard if self.val_reward_fn is reward_fn
                           else GuardedReward(self.val_reward_fn, reward_cfg.on_error, reward_cfg.timeout_s))
        self.val_dataset = val_dataset
        self.train_dataloader = PromptStream(train_dataset, config.data.rollout_batch_size, config.data.shuffle,
                                             config.data.seed, collate_fn)
        steps_per_epoch = len(self.train_dataloader)
        self.training_steps = steps_per_epoch * config.trainer.total_epochs
        if config.trainer.max_steps is not None:
            self.training_steps = min(self.training_steps, config.trainer.max_steps)
        config.worker.actor.optim.training_steps = self.training_steps
        config.worker.critic.optim.training_steps = self.training_steps
        algo = config.algorithm
        self.kl_ctrl = make_kl_controller(algo.kl_type, algo.kl_coef, algo.kl_target, algo.kl_horizon)
        self.workers: Optional[WorkerGroup] = None
        self._scorer = None  # the reward actor (RewardScorer), started on first use
        self.model_shape: Optional[ModelShape] = None  # for perf/mfu/*, set with the workers
        self.peak_flops: Optional[float] = None
        self.global_step = 0
        self.last_batch: Optional[Batch] = None  # the most recent training batch, for inspection
        self.last_checkpoint: Optional[str] = None  # the newest complete checkpoint of this run
        self.stop_signal: Optional[int] = None  # the signal that stopped fit() early, if any
        self._prompts: Optional[Iterator[dict[str, list]]] = None
        self._reward_errors = 0  # samples the reward function failed on in this step
        self._last_frac_zero_std: Optional[float] = None  # the previous step's reward/frac_reward_zero_std
        self.val_generations: list[dict[str, Any]] = []  # the last validation's first samples (for the loggers)

    def init_workers(self, device: str, worker_cls: type = FSDPWorker) -> None:
        """Start the Ray workers (process group, FSDP2 actor/ref, vLLM engines); ``worker_cls``: ``FSDPWorker`` or a
        subclass (the tests' ``easyrl.testing.worker.InspectableWorker``)."""
        self.workers = WorkerGroup(self.config, device, worker_cls)
        self._init_perf()

    def _init_perf(self) -> None:
        """The model's shape for the FLOPs formula and the devices' peak FLOP/s (None on the CPU: no MFU)."""
        from transformers import AutoConfig

        model = self.config.worker.actor.model
        hf_config = AutoConfig.from_pretrained(model.model_path, trust_remote_code=model.trust_remote_code)
        try:
            self.model_shape = ModelShape.from_hf_config(hf_config)
        except Exception as e:  # an architecture transformers cannot build from its config alone: no MFU, no stop
            logger.warning("perf/mfu/* not reported: cannot count the weights of %s (%s)", model.model_path, e)
        self.peak_flops = peak_flops(self.workers.run_all(FSDPWorker.device_name)[0])

    def _compute_advantage(self, batch: Batch) -> None:
        algo = self.config.algorithm
        estimator = get_adv_estimator(algo.adv_estimator)
        advantages, returns = estimator(
            batch["token_level_rewards"], batch["response_mask"], np.array(batch["uid"], dtype=object),
            gamma=algo.gamma, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            reward_baselines=batch["reward_baselines"] if "reward_baselines" in batch else None,
            **({"values": batch["values"], "lam": algo.lam} if algo.needs_critic else {}),
        )
        batch["advantages"] = advantages
        batch["returns"] = returns

    # ----------------------------------------------------------------------------------------------- the loop
    def fit(self) -> None:
        """Train until ``training_steps``; validate, checkpoint and export the actor as configured.

        Resumes from ``trainer.load_checkpoint_path``, or else (``trainer.find_last_checkpoint``) from the last
        complete checkpoint under ``trainer.save_checkpoint_path``. A checkpoint is saved every ``save_freq`` steps,
        after the last step, and when SIGTERM/SIGINT asks the run to stop (``stop_signal`` then names it and fit
        returns after that save, without exporting).

        Raises:
            RunStateError: the run folder holds another run's metrics or checkpoints, and this run does not resume.
            RuntimeError: a worker died or failed (names its rank and the last good checkpoint to resume from).
        """
        cfg = self.config
        resume_from = self._checkpoint_to_resume()
        tracker = Tracker(cfg.trainer.logger, cfg.trainer.run_dir, cfg.trainer.project_name,
                          cfg.trainer.experiment_name, to_dict(cfg), total_steps=self.training_steps,
                          initial_step=0 if resume_from is None else self._step_of(resume_from),
                          resume=resume_from is not None)
        os.makedirs(cfg.trainer.run_dir, exist_ok=True)
        config_name = "config.yaml" if resume_from is None else f"config_resume_step_{self._step_of(resume_from)}.yaml"
        OmegaConf.save(OmegaConf.structured(cfg), os.path.join(cfg.trainer.run_dir, config_name))
        try:
            with GracefulStop() as stop:
                if resume_from is not None:
                    self.load_checkpoint(resume_from)
                self._train_loop(tracker, stop)
        except WorkerError as err:
            raise RuntimeError(
                f"{err}. The run stopped; the last good checkpoint is {self.last_checkpoint or 'none (no step saved)'}"
                f", and starting the same command again resumes from it."
            ) from err
        finally:
            tracker.close()
            self._guard.close()
            self._val_guard.close()

    def _train_loop(self, tracker: Tracker, stop: GracefulStop) -> None:
        cfg = self.config
        if self.val_dataset is not None and self.global_step == 0 and (cfg.trainer.val_before_train
                                                                       or cfg.trainer.val_only):
            tracker.log(self.validate(), step=self.global_step, generations=self.val_generations)
            if cfg.trainer.val_only:
                return
        if self.global_step >= self.training_steps:
            logger.warning("the checkpoint is at step %d and this run has %d steps: nothing to train (raise "
                           "trainer.max_steps or trainer.total_epochs to train further)", self.global_step,
                           self.training_steps)
        self._prompts = iter(self.train_dataloader)
        while self.global_step < self.training_steps:
            self.global_step += 1
            metrics = self.train_step(self._prompts)
            generations = None
            if self._should_validate():
                metrics.update(self.validate())
                generations = self.val_generations
            tracker.log(metrics, step=self.global_step, generations=generations)
            freq = cfg.trainer.save_freq
            last = self.global_step == self.training_steps
            if last or stop.requested or (freq > 0 and self.global_step % freq == 0):
                self.save_checkpoint(metrics)
            if stop.requested:
                self.stop_signal = stop.signum
                logger.warning("stopped after step %d on a signal; checkpoint %s", self.global_step,
                               self.last_checkpoint)
                return
        if self.global_step == self.training_steps and not cfg.trainer.val_only:
            self.save_model()

    def prompt_stream(self) -> Iterator[dict[str, list]]:
        """Batches of ``data.rollout_batch_size`` prompts, epoch after epoch (reshuffled each epoch), from the
        current position of ``train_dataloader`` (a ``PromptStream``)."""
        return iter(self.train_dataloader)

    def train_step(self, prompt_stream: Iterator[dict[str, list]]) -> dict[str, float]:
        """One step of GRPO-style RL on the next batch of prompts; returns the step's metrics."""
        cfg = self.config
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        with timer("step", timing):
            batch, pending = self._make_batch(prompt_stream, timing, metrics)  # gen (+ reward, dynamic sampling)
            order = self._balance(batch, metrics)
            batch = batch.select(order)  # rank r gets the r-th equal share: about as many tokens as the others
            staged = self._stage_multi_modal(batch)  # each share's images reach its worker once, not once per pass
            on_policy = cfg.on_policy_update
            if not on_policy:
                with timer("old_log_prob", timing):
                    old = self.workers.run_split(FSDPWorker.compute_log_probs, for_workers(batch, staged))
                    batch["old_log_probs"] = torch.cat(old, dim=0)
                if "rollout_log_probs" in batch:
                    metrics.update(rollout_mismatch_metrics(batch))
            if self.workers_need_ref():
                with timer("ref", timing):
                    ref = self.workers.run_split(FSDPWorker.compute_ref_log_probs, for_workers(batch, staged))
                    batch["ref_log_probs"] = torch.cat(ref, dim=0)
            if pending is not None:  # scored in the reward actor while the log-prob passes ran
                with timer("reward", timing):
                    self._reward_wait(batch, pending, order)
            for key in [key for key in batch.extras if key.startswith("score/")]:  # unless set over all generated
                metrics.setdefault(key.replace("score/", "reward/", 1), float(np.mean(batch[key])))
            metrics["reward/errors"] = float(self._reward_errors)
            metrics["reward/frac_reward_zero_std"] = self._check_reward_variance(batch)
            if cfg.algorithm.needs_critic:
                with timer("values", timing):
                    values = self.workers.run_split(FSDPWorker.compute_values, for_workers(batch, staged))
                    batch["values"] = torch.cat(values, dim=0)
            with timer("adv", timing):
                if cfg.algorithm.use_kl_in_reward and not cfg.algorithm.disable_kl:
                    batch["token_level_rewards"], kl_metrics = apply_kl_penalty(
                        batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_probs"],
                        batch["response_mask"], self.kl_ctrl, cfg.algorithm.kl_penalty,
                    )
                    metrics.update(kl_metrics)
                else:
                    batch["token_level_rewards"] = batch["token_level_scores"]
                self._compute_advantage(batch)
            worker_metrics = []
            if cfg.algorithm.needs_critic:
                with timer("update_critic", timing):
                    worker_metrics += self.workers.run_split(FSDPWorker.update_critic, for_workers(batch, staged))
            actor_metrics = []
            if self.actor_updates_this_step():
                with timer("update_actor", timing):
                    actor_metrics = self.workers.run_split(FSDPWorker.update_actor, for_workers(batch, staged))
            worker_metrics += actor_metrics
            if on_policy and actor_metrics:  # the update's own (pre-step) log-probs are the old ones
                batch["old_log_probs"] = torch.cat([m.pop("old_log_probs") for m in actor_metrics], dim=0)
                if "rollout_log_probs" in batch:
                    metrics.update(rollout_mismatch_metrics(batch))
            merged = defaultdict(list)
            for per_worker in worker_metrics:
                for key, values in per_worker.items():
                    merged[key].extend(values)
            metrics.update(reduce_metrics(merged))
            if has_multi_modal(batch):  # the staged inputs are freed; what the workers received, once per step
                released = self.workers.run_all(FSDPWorker.release_multi_modal)
                metrics["perf/multi_modal_bytes_to_workers"] = float(sum(released))
            batch = batch.select(np.argsort(order).tolist())  # back to the group order of generation
        metrics.update(compute_data_metrics(batch, cfg.data.max_prompt_length, cfg.data.max_response_length))
        if "reshard" in timing:  # the weight sync is reported apart from the generation that waited for it
            timing["gen"] = max(timing["gen"] - timing["reshard"], 0.0)
        metrics.update({f"timing_s/{name}": seconds for name, seconds in timing.items()})
        ppo_epochs = cfg.worker.actor.ppo_epochs
        metrics.update(compute_throughput_metrics(batch, timing["step"], self.workers.world_size, timing, ppo_epochs))
        if self.model_shape is not None:
            metrics.update(compute_mfu_metrics(self.model_shape, batch["attention_mask"], batch["multi_modal_inputs"],
                                               timing, self.workers.world_size, self.peak_flops, ppo_epochs))
        self.last_batch = batch
        return metrics

    def _balance(self, batch: Batch, metrics: dict[str, float]) -> list[int]:
        """The order that gives every worker an equal share of samples with nearly equal token counts
        (``trainer.balance_batch``, Karmarkar-Karp; identity when off). Adds ``perf/padding_fraction`` (share of the
        padded ``bsz x (prompt + response)`` positions that are padding) and ``perf/max_rank_tokens_ratio``
        (the busiest rank's tokens over the mean)."""
        lengths = batch["attention_mask"].sum(-1)
        world = self.workers.world_size
        if self.config.trainer.balance_batch:
            order = balanced_rank_order(lengths.tolist(), world)
        else:
            order = list(range(len(batch)))
        per_rank = lengths[order].view(world, -1).sum(-1).double()
        metrics["perf/padding_fraction"] = 1.0 - lengths.sum().item() / batch["attention_mask"].numel()
        metrics["perf/max_rank_tokens_ratio"] = (per_rank.max() / per_rank.mean().clamp(min=1)).item()
        return order

    def _stage_multi_modal(self, batch: Batch) -> Optional[list[tuple[str, int]]]:
        """Ship each worker its share of the balanced ``batch``'s ``multi_modal_inputs`` once for the step
        (``FSDPWorker.stage_multi_modal``); returns the per-sample references the passes send instead, or None for a
        batch without images (nothing staged)."""
        if not has_multi_modal(batch):
            return None
        references = stage_references(len(batch))
        self.workers.run_split(FSDPWorker.stage_multi_modal, staging_batch(batch, references))
        return references

    def _check_reward_variance(self, batch: Batch) -> float:
        """``frac_reward_zero_std`` of the training batch; warns when every group's rewards become equal (once per
        run of such steps)."""
        scores = batch["token_level_scores"].sum(-1).tolist()
        frac = frac_reward_zero_std(scores, batch["uid"])
        if constant_rewards_began(frac, self._last_frac_zero_std):
            logger.warning(constant_reward_warning(self.global_step, len(set(batch["uid"])), scores))
        self._last_frac_zero_std = frac
        return frac

    def actor_updates_this_step(self) -> bool:
        """Whether this step (1-based ``global_step``) updates the actor: always without a critic; with one from step
        ``trainer.critic_warmup`` on (verl's and EasyR1's test ``critic_warmup <= global_step``: ``critic_warmup: 3``
        gives 2 critic-only steps, 0 and 1 none)."""
        return not self.config.algorithm.needs_critic or self.config.trainer.critic_warmup <= self.global_step

    def workers_need_ref(self) -> bool:
        """Whether a KL term (loss or in-reward) needs reference log-probs this step."""
        return self.config.algorithm.needs_reference

    def save_model(self) -> str:
        """Export the actor in Hugging Face format to ``trainer.save_model_path`` (default ``<run_dir>/huggingface``;
        see ``easyrl.export``)."""
        path = self.config.trainer.save_model_path or os.path.join(self.config.trainer.run_dir, "huggingface")
        self.workers.run_all(FSDPWorker.save_hf, path)
        logger.info("actor exported to %s", path)
        return path
