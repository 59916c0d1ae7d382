"""``RayPPOTrainer``: the training loop, read top to bottom as the algorithm.

Each step: generate -> reward -> old log-prob -> ref log-prob -> values (with a critic) -> advantage -> update critic
-> update actor, every phase timed (``timing_s/<phase>``). The driver holds the batch and the reward function; the
workers (one Ray actor per device) hold the FSDP2 actor, the reference, the critic and a vLLM engine each.
On-policy distillation adds the teacher's log-prob pass (``timing_s/teacher``) and its reverse KL to the advantage.

Parts, each owning its state: the placement (``placement``: ``Colocated``, ``Split`` or a replay's ``TrainOnly``,
which starts the worker groups), the batch source it chooses (``batch_source``: generated when the step starts, ahead:
``async_rollout``, or read from a rollout dump), ``Generator`` (``generation``) over a ``Rollout`` (``rollout``:
prompts -> trajectories; also the padded layout), ``Scorer`` and ``ModelRewards`` (``scoring``), ``Validator``
(``validation``), ``Checkpointer`` (``checkpoint``) and, with ``trainer.rollout_data_dir``, the ``RolloutDump`` that
writes each trained batch (``rollout_dump``, docs/replay.md); ``metrics`` holds the metric names and timers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any, Optional, Union

import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoConfig

from easyrl.algorithms.advantages import AdvantageInputs, compute_advantage
from easyrl.algorithms.distillation import add_distillation, reverse_kl_metrics, token_reverse_kl
from easyrl.algorithms.kl import apply_kl_penalty, make_kl_controller
from easyrl.batch import Batch
from easyrl.config import PPOConfig, to_dict
from easyrl.config.actor import route_teachers, teachers_of
from easyrl.config.ppo import OldLogProbs
from easyrl.data.dataset import collate_fn
from easyrl.data.loader import PromptStream
from easyrl.rewards.function import RewardFunction
from easyrl.rng import get_rng_state, set_rng_state
from easyrl.sizing.anatomy import ModelShape, model_anatomy
from easyrl.sizing.devices import peak_flops
from easyrl.sizing.flops import compute_mfu_metrics
from easyrl.trainer.checkpoint import Checkpointer, run_identity
from easyrl.trainer.generation import Generator
from easyrl.trainer.launch import GracefulStop, StartupProfile
from easyrl.trainer.loggers import Tracker
from easyrl.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    frac_reward_zero_std,
    reduce_metrics,
    reward_metrics,
    rollout_mismatch_metrics,
    timer,
)
from easyrl.trainer.agent_rollout import agent_metrics
from easyrl.trainer.batch_source import BatchSource
from easyrl.trainer.multi_turn import multi_turn_metrics
from easyrl.trainer.placement import Colocated, Split, TrainOnly, start_placement
from easyrl.trainer.rollout import data_sources, for_workers
from easyrl.trainer.rollout_dump import RolloutDump
from easyrl.trainer.run_folder import checkpoint_to_resume
from easyrl.trainer.scoring import ModelRewards, Scorer
from easyrl.trainer.session_rows import SESSION, add_segment_rows, scoring_view, session_positions, share_scores
from easyrl.trainer.validation import Validator
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.group import WorkerError, WorkerGroup
from easyrl.workers.mm_staging import has_multi_modal, stage_references, staging_batch
from easyrl.workers.seqlen_balancing import balanced_rank_order
from easyrl.workers.weight_sync import check_weight_sync

logger = logging.getLogger("easyrl.trainer")


class RayPPOTrainer:
    """Runs GRPO-style RL (phases and parts: the module docstring); ``reward_fn`` and ``val_reward_fn`` may be the
    same object."""

    rollout_dump: Optional[RolloutDump] = None  # trainer.rollout_data_dir: writes each trained batch (init_workers)

    def __init__(self, config: PPOConfig, tokenizer, train_dataset, val_dataset, reward_fn: RewardFunction,
                 val_reward_fn: Optional[RewardFunction] = None):
        self.config = config
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.scorer = Scorer(config.worker.reward, tokenizer, reward_fn, val_reward_fn)
        self.val_dataset = val_dataset
        self.train_dataset = train_dataset  # its processor and pixel bounds serve tool images (multi_turn)
        self.train_dataloader = PromptStream(train_dataset, config.data.generation_batch_size, config.data.shuffle,
                                             config.data.seed, collate_fn)
        self.training_steps = config.training_steps(len(train_dataset))  # the workers' LR schedules get it too
        algo = config.algorithm
        self.kl_ctrl = make_kl_controller(algo.kl_type, algo.kl_coef, algo.kl_target, algo.kl_horizon)
        # the parts that need the workers are made with them (init_workers)
        # where the engines run (none in a replay); holds the worker groups
        self.placement: Optional[Union[Colocated, Split, TrainOnly]] = None
        self.workers: Optional[WorkerGroup] = None  # the trainer's workers (the model roles)
        self.batches: Optional[BatchSource] = None  # where a step's batch comes from, chosen with the placement
        self.generator: Optional[Generator] = None
        self.validator: Optional[Validator] = None
        self.checkpointer: Optional[Checkpointer] = None
        self.model_rewards: Optional[ModelRewards] = None  # the judge and reward model, set with the workers
        self.model_shape: Optional[ModelShape] = None  # for perf/mfu/*, set with the workers
        self.peak_flops: Optional[float] = None
        self.global_step = 0
        self.last_batch: Optional[Batch] = None  # the most recent training batch, for inspection
        self.stop_signal: Optional[int] = None  # the signal that stopped fit() early, if any
        self._last_frac_zero_std: Optional[float] = None  # the previous step's reward/frac_reward_zero_std
        self.startup: Optional[StartupProfile] = None  # reported in the first step's metrics (build_trainer sets it)

    def init_workers(self, device: str, worker_cls: type = FSDPWorker) -> None:
        """Start the Ray workers (``worker_cls``: ``FSDPWorker`` or a subclass) where ``config.placement`` puts them
        (``easyrl.trainer.placement``), and the parts that call them."""
        cfg = self.config
        self.placement = start_placement(cfg, device, worker_cls, self.training_steps, self.pad_id)
        self.workers = self.placement.workers
        self.generator = Generator(cfg, self.placement.rollout(self.tokenizer, self.train_dataset), self.scorer,
                                   self.pad_id)
        self.batches = self.placement.batches(self.generator, self.scorer, self.train_dataloader.state_dict,
                                              self.training_steps)
        self.model_rewards = ModelRewards.create(cfg, self.scorer, self.workers)
        self.validator = Validator(cfg, self.val_dataset, self.generator, self.scorer, self.tokenizer,
                                   self.model_rewards)
        self.checkpointer = Checkpointer(cfg.trainer, self.workers, run_identity(cfg))
        self.rollout_dump = RolloutDump.create(  # the prompt stream's position a checkpoint would save
            cfg, self.training_steps, lambda: self.batches.prompt_position() or self.train_dataloader.state_dict())
        # perf/mfu/*: the model's shape for the FLOPs formula and the devices' peak FLOP/s (None on the CPU: no MFU)
        model = cfg.worker.actor.model
        hf_config = AutoConfig.from_pretrained(model.model_path, trust_remote_code=model.trust_remote_code)
        try:
            self.model_shape = model_anatomy(hf_config, model.trust_remote_code)[2]
        except Exception as e:  # an architecture transformers cannot build from its config alone: no MFU, no stop
            logger.warning("perf/mfu/* not reported: cannot count the weights of %s (%s)", model.model_path, e)
        self.peak_flops = peak_flops(self.workers.run_all(FSDPWorker.device_name)[0])

    def close(self) -> None:
        """End the run's parts, once (a second call does nothing): what generates ahead, the rollout's background
        (request stream, tool processes, agent endpoint), the placement's shared stream, then the workers
        (``WorkerGroup.shutdown``: their shared memory released, the actors killed)."""
        if self.workers is None:
            return
        rollout = self.generator.rollout if self.generator is not None else None
        for part in (self.batches, rollout, self.placement):  # None where init_workers stopped before it
            if part is not None:
                part.close()
        self.workers.shutdown()
        self.workers = None

    def _compute_advantage(self, batch: Batch) -> None:
        algo = self.config.algorithm
        advantages, returns = compute_advantage(algo.adv_estimator, AdvantageInputs(
            batch["token_level_rewards"], batch["response_mask"], np.array(batch["uid"], dtype=object),
            gamma=algo.gamma, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            reward_baselines=batch["reward_baselines"] if "reward_baselines" in batch else None,
            **({"values": batch["values"], "lam": algo.lam} if algo.needs_critic else {}),
            **({"old_log_probs": batch["old_log_probs"], "teacher_log_probs": batch["teacher_log_probs"]}
               if algo.needs_teacher else {}),
        ), sessions=session_positions(batch))  # agent segment rows: their session's advantage
        batch["advantages"] = advantages
        batch["returns"] = returns

    def _distill(self, batch: Batch) -> dict[str, float]:
        """``distill/reverse_kl``: mean per-token ``log pi_student - log pi_teacher`` over the response (with several
        teachers also ``distill/reverse_kl/<name>``); with ``algorithm.distill_coef > 0`` that times the coefficient
        is subtracted from the advantages."""
        algo = self.config.algorithm
        reverse_kl = token_reverse_kl(batch["old_log_probs"], batch["teacher_log_probs"], batch["response_mask"])
        if algo.distill_coef > 0:
            batch["advantages"] = add_distillation(batch["advantages"], reverse_kl, algo.distill_coef)
        names = [teacher.name for teacher in teachers_of(self.config.worker)]
        per_teacher = batch["teacher_index"] if len(names) > 1 else None  # one teacher: its metric is the total
        return reverse_kl_metrics(reverse_kl, batch["response_mask"], per_teacher, names)

    # ----------------------------------------------------------------------------------------------- the loop
    def fit(self) -> None:
        """Train until ``training_steps``; validate, checkpoint and export the actor as configured.

        Resumes as ``checkpoint_to_resume`` says. A checkpoint is saved every ``save_freq`` steps, after the last
        step, and when SIGTERM/SIGINT asks the run to stop (``stop_signal`` then names it and fit returns after that
        save, without exporting). Raises ``RunStateError`` (another run's folder, not resuming) or ``RuntimeError``
        (a worker died or failed; names its rank and the last good checkpoint)."""
        cfg = self.config
        resume_from = checkpoint_to_resume(cfg.trainer)
        start_step = 0 if resume_from is None else Checkpointer.step_of(resume_from)
        tracker = Tracker(cfg.trainer.logger, cfg.trainer.run_dir, cfg.trainer.project_name,
                          cfg.trainer.experiment_name, to_dict(cfg), total_steps=self.training_steps,
                          initial_step=start_step, resume=resume_from is not None)
        os.makedirs(cfg.trainer.run_dir, exist_ok=True)
        config_name = "config.yaml" if resume_from is None else f"config_resume_step_{start_step}.yaml"
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
            if self.batches is not None:  # generating ahead: stopped, what it made ahead dropped
                self.batches.close()
            tracker.close()
            self.scorer.close()

    def _train_loop(self, tracker: Tracker, stop: GracefulStop) -> None:
        cfg = self.config
        if self.val_dataset is not None and self.global_step == 0 and (cfg.trainer.val_before_train
                                                                       or cfg.trainer.val_only):
            self.batches.update_engines()
            val_metrics = self.validator.run(self.global_step)
            if self.startup is not None:
                self.startup.add("validation", val_metrics["timing_s/validation"])
            tracker.log(val_metrics, step=self.global_step, generations=self.validator.generations)
            if cfg.trainer.val_only:
                return
        if self.global_step >= self.training_steps:
            logger.warning("the checkpoint is at step %d and this run has %d steps: nothing to train (raise "
                           "trainer.max_steps or trainer.total_epochs to train further)", self.global_step,
                           self.training_steps)
        prompts = self.prompt_stream()
        while self.global_step < self.training_steps:
            self.global_step += 1
            metrics = self.train_step(prompts)
            if self.startup is not None:
                metrics.update(self.startup.report(metrics))  # after the first step only
            generations = None
            if self.validator.due(self.global_step, self.training_steps):
                self.batches.update_engines()  # split: the engines get the weights this step trained
                metrics.update(self.validator.run(self.global_step))
                generations = self.validator.generations
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
            batch, pending, generated, failures = self.batches.next_batch(prompt_stream, self.global_step, timing,
                                                                          metrics)  # gen, reward
            if "agent_segments" in batch:  # agent sessions' earlier segments: rows of their own (session_rows)
                batch = add_segment_rows(batch, self.workers.dp_size, cfg.data.max_prompt_length,
                                         cfg.data.max_response_length, self.pad_id)
            occupancy = self.generator.rollout.slot_occupancy()
            if occupancy is not None:  # the share of the engines' decode slots that held a sequence
                metrics["rollout/slot_occupancy"] = occupancy
            order = self._balance(batch, metrics)
            batch = batch.select(order)  # rank r gets the r-th equal share: about as many tokens as the others
            staged = self._stage_multi_modal(batch)  # each share's images reach its worker once, not once per pass

            def forward(phase: str, method, key: str) -> None:  # one pass over the workers' shares, timed
                with timer(phase, timing):
                    batch[key] = torch.cat(self.workers.run_split(method, for_workers(batch, staged)), dim=0)
            source = cfg.old_log_probs_source  # recompute, update (on-policy) or rollout (algorithm.bypass_mode)
            on_policy = source is OldLogProbs.UPDATE
            if source is OldLogProbs.ROLLOUT:  # vLLM's log-probs are the old policy's: nothing to compare them with
                batch["old_log_probs"] = batch["rollout_log_probs"]
            elif source is OldLogProbs.RECOMPUTE:
                if cfg.worker.actor.router_replay.records_old:  # R2: and the routing the update replays
                    with timer("old_log_prob", timing):
                        outs = self.workers.run_split(FSDPWorker.compute_log_probs_and_routing,
                                                      for_workers(batch, staged))
                    for key in ("old_log_probs", "routed_experts"):
                        batch[key] = torch.cat([out[key] for out in outs], dim=0)
                else:
                    forward("old_log_prob", FSDPWorker.compute_log_probs, "old_log_probs")
                if "rollout_log_probs" in batch:
                    metrics.update(rollout_mismatch_metrics(batch))
                    check_weight_sync(metrics["rollout/log_prob_diff_median"], cfg.sync_check_threshold)
            if cfg.algorithm.needs_reference:  # a KL term (loss or in-reward) reads the reference's log-probs
                forward("ref", FSDPWorker.compute_ref_log_probs, "ref_log_probs")
            if cfg.algorithm.needs_teacher:  # on-policy distillation: each sample's teacher scores it
                batch["teacher_index"] = torch.tensor(route_teachers(teachers_of(cfg.worker), data_sources(batch)))
                forward("teacher", FSDPWorker.compute_teacher_log_probs, "teacher_log_probs")
            scored = scoring_view(batch)  # one row per agent session (the batch itself without segment rows)
            if pending is not None:  # scored in the reward actor while the log-prob passes ran
                with timer("reward", timing):
                    failures += self.scorer.wait(scored, pending, scored[SESSION] if SESSION in scored else order)
            self.model_rewards.run(scored, timing, metrics)  # the judge's and reward model's scores, into overall
            share_scores(batch, scored)
            metrics.update(reward_metrics(scored, generated, failures, self._check_reward_variance(scored)))
            if cfg.algorithm.needs_critic:
                forward("values", FSDPWorker.compute_values, "values")
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
                if cfg.algorithm.needs_teacher:
                    metrics.update(self._distill(batch))
            critic_metrics, actor_metrics = [], []
            if cfg.algorithm.needs_critic:
                with timer("update_critic", timing):
                    critic_metrics = self.workers.run_split(FSDPWorker.update_critic, for_workers(batch, staged))
            if self.actor_updates_this_step():
                with timer("update_actor", timing):
                    actor_metrics = self.workers.run_split(FSDPWorker.update_actor, for_workers(batch, staged))
            if on_policy and actor_metrics:  # the update's own (pre-step) log-probs (sync checked before the step)
                batch["old_log_probs"] = torch.cat([m.pop("old_log_probs") for m in actor_metrics], dim=0)
                if "rollout_log_probs" in batch:
                    metrics.update(rollout_mismatch_metrics(batch))
            metrics.update(reduce_metrics(*critic_metrics, *actor_metrics))
            if has_multi_modal(batch):  # the staged inputs are freed; what the workers received, once per step
                received = self.workers.run_all(FSDPWorker.release_multi_modal)
                metrics["perf/multi_modal_bytes_to_workers"] = float(sum(received))
            batch = batch.select(np.argsort(order).tolist())  # back to the group order of generation
        metrics.update(compute_data_metrics(batch, cfg.data.max_prompt_length, cfg.data.max_response_length))
        metrics.update(multi_turn_metrics(batch))
        metrics.update(agent_metrics(batch))
        if "routed_experts" in batch:  # routing replay: what the step's replayed routing holds (int16)
            metrics["moe/routing_gib"] = batch["routed_experts"].numel() * 2 / 2**30
        if "reshard" in timing:  # the weight sync is reported apart from the generation that waited for it
            timing["gen"] = max(timing["gen"] - timing["reshard"], 0.0)
        metrics.update({f"timing_s/{name}": seconds for name, seconds in timing.items()})
        ppo_epochs = cfg.worker.actor.ppo_epochs
        metrics.update(compute_throughput_metrics(batch, timing["step"], self.workers.world_size, timing, ppo_epochs))
        if self.model_shape is not None:
            metrics.update(compute_mfu_metrics(self.model_shape, batch["attention_mask"], batch["multi_modal_inputs"],
                                               timing, self.workers.world_size, self.peak_flops, ppo_epochs))
        self.batches.step_done(metrics)
        if self.rollout_dump is not None:  # the trained batch and its metrics, for easyrl rollouts and a replay
            self.rollout_dump.write(self.global_step, batch, metrics)
        self.last_batch = batch
        return metrics

    def _balance(self, batch: Batch, metrics: dict[str, float]) -> list[int]:
        """The order that gives every worker an equal share of samples with nearly equal token counts
        (``trainer.balance_batch``, Karmarkar-Karp; identity when off). Adds ``perf/padding_fraction`` (share of the
        padded ``bsz x (prompt + response)`` positions that are padding) and ``perf/max_rank_tokens_ratio``
        (the busiest rank's tokens over the mean)."""
        lengths = batch["attention_mask"].sum(-1)
        world = self.workers.dp_size
        if self.config.trainer.balance_batch:
            order = balanced_rank_order(lengths.tolist(), world)
        else:
            order = list(range(len(batch)))
        per_rank = lengths[order].view(world, -1).sum(-1).double()
        metrics["perf/padding_fraction"] = 1.0 - lengths.sum().item() / batch["attention_mask"].numel()
        metrics["perf/max_rank_tokens_ratio"] = (per_rank.max() / per_rank.mean().clamp(min=1)).item()
        return order

    def _stage_multi_modal(self, batch: Batch) -> Optional[list[tuple[str, int]]]:
        """Ship each worker its share of the balanced ``batch``'s ``multi_modal_inputs`` once for the step; returns
        the per-sample references the passes send instead, or None for a batch without images."""
        if not has_multi_modal(batch):
            return None
        references = stage_references(len(batch))
        self.workers.run_split(FSDPWorker.stage_multi_modal, staging_batch(batch, references))
        return references

    def _check_reward_variance(self, batch: Batch) -> float:
        """``frac_reward_zero_std`` of the training batch; warns when every group's rewards become equal (once per
        run of such steps), unless the advantage does not use the reward (pure distillation)."""
        scores = batch["token_level_scores"].sum(-1).tolist()
        frac = frac_reward_zero_std(scores, batch["uid"])
        if self.config.algorithm.estimator("uses_reward") and frac == 1.0 and self._last_frac_zero_std != 1.0:
            values = ", ".join(f"{s:g}" for s in sorted(set(scores))[:5])
            logger.warning(f"step {self.global_step}: every one of the {len(set(batch['uid']))} groups has equal "
                           f"rewards (scores {values}): all advantages are 0, so only the KL term moves the policy. "
                           "Check that responses can earn a reward (e.g. the model never answers in the rewarded "
                           "format; see reward/* in metrics.jsonl). Not repeated while it lasts.")
        self._last_frac_zero_std = frac
        return frac

    def actor_updates_this_step(self) -> bool:
        """Whether this step (1-based ``global_step``) updates the actor: always without a critic; with one from step
        ``trainer.critic_warmup`` on (``critic_warmup: 3`` gives 2 critic-only steps, 0 and 1 none)."""
        return not self.config.algorithm.needs_critic or self.config.trainer.critic_warmup <= self.global_step

    def save_model(self) -> str:
        """Export the actor in Hugging Face format to ``trainer.save_model_path`` (default ``<run_dir>/huggingface``;
        see ``easyrl.export``)."""
        path = self.config.trainer.save_model_path or os.path.join(self.config.trainer.run_dir, "huggingface")
        self.workers.run_all(FSDPWorker.save_hf, path)
        logger.info("actor exported to %s", path)
        return path

    # --------------------------------------------------------------------------------------------- checkpoints
    @property
    def last_checkpoint(self) -> Optional[str]:
        """The newest complete checkpoint of this run (None before the first save or resume)."""
        return self.checkpointer.last if self.checkpointer is not None else None

    def save_checkpoint(self, metrics: Optional[dict[str, float]] = None) -> str:
        """Save the whole training state as ``global_step_<N>`` (``Checkpointer.save``); ``metrics`` of this step
        rank it by ``trainer.best_metric``. Returns the checkpoint folder."""
        return self.checkpointer.save(self.global_step, self.state_dict(), metrics)

    def load_checkpoint(self, path: str) -> None:
        """Restore the training state saved by :meth:`save_checkpoint` (the workers' and this process's)."""
        self.load_state_dict(self.checkpointer.load(path))
        logger.info("resumed from %s at step %d", path, self.global_step)

    def state_dict(self) -> dict[str, Any]:
        """This process's part of the training state: step, prompt-stream position (after the last trained batch:
        ``BatchSource.prompt_position``), KL coefficient, RNG states."""
        position = self.batches.prompt_position() if self.batches is not None else None
        return {"global_step": self.global_step, "prompt_stream": position or self.train_dataloader.state_dict(),
                "kl_coef": self.kl_ctrl.value, "rng": get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (before iterating over the prompts); what the batch source made
        ahead is dropped."""
        if self.batches is not None:
            self.batches.restart(state["global_step"], state["prompt_stream"])
        self.global_step = state["global_step"]
        self.train_dataloader.load_state_dict(state["prompt_stream"])
        self.kl_ctrl.value = state["kl_coef"]
        set_rng_state(state["rng"])
