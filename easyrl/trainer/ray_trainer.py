"""``RayPPOTrainer``: the training loop, read top to bottom as the algorithm.

Each step: generate -> reward -> old log-prob -> ref log-prob -> advantage -> update actor, every phase timed
(``timing_s/<phase>``). The trainer process (the Ray driver) holds the batch and the reward function; the workers
(one Ray actor per device) hold the FSDP2 actor, the reference policy and a vLLM engine each.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

import numpy as np
import ray
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from torch.utils.data import DataLoader

from easyrl.algorithms.advantages import get_adv_estimator
from easyrl.algorithms.dynamic_sampling import select_groups
from easyrl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
)
from easyrl.algorithms.losses import compute_tis_weights
from easyrl.batch import Batch
from easyrl.config import PPOConfig, to_dict
from easyrl.data.dataset import collate_fn
from easyrl.data.loader import PromptStream
from easyrl.rewards.function import RewardFunction, scores_to_token_rewards
from easyrl.rewards.guard import GuardedReward
from easyrl.rewards.remote import RewardScorer
from easyrl.trainer.checkpoint import (
    TRAINER_STATE,
    checkpoint_to_resume,
    commit_checkpoint,
    get_rng_state,
    set_rng_state,
)
from easyrl.trainer.flops import ModelShape, compute_mfu_metrics, peak_flops
from easyrl.trainer.loggers import Tracker
from easyrl.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    constant_reward_warning,
    frac_reward_zero_std,
    generation_rows,
    reduce_metrics,
)
from easyrl.trainer.seeding import batch_seeds
from easyrl.trainer.signals import GracefulStop
from easyrl.workers.group import WorkerError, WorkerGroup
from easyrl.workers.seqlen_balancing import balanced_rank_order

logger = logging.getLogger("easyrl.trainer")


@contextmanager
def timer(name: str, timing: dict[str, float]):
    """Adds the seconds spent in the block to ``timing[name]``."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def _left_pad(rows: list[list[int]], length: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row) > length:
            raise ValueError(f"A prompt of {len(row)} tokens exceeds data.max_prompt_length={length}.")
        if row:
            ids[i, length - len(row):] = torch.tensor(row)
            mask[i, length - len(row):] = 1
    return ids, mask


def _right_pad(rows: list[list[Any]], length: int, pad_value: Any, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.full((len(rows), length), pad_value, dtype=dtype)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        row = row[:length]
        if row:
            values[i, : len(row)] = torch.tensor(row, dtype=dtype)
            mask[i, : len(row)] = 1
    return values, mask


def rollout_mismatch_metrics(batch: Batch) -> dict[str, float]:
    """How far vLLM's sampled-token log-probs are from the actor's recomputed ones (same weights, other kernels):
    ``rollout/probs_diff_{mean,max}``, ``rollout/log_ppl_diff`` (see ``compute_tis_weights``) and
    ``rollout/log_prob_diff_max`` = max |logp_rollout - logp_old| over valid tokens."""
    mask = batch["response_mask"]
    _, metrics = compute_tis_weights(batch["old_log_probs"], batch["rollout_log_probs"], mask, cap=float("inf"))
    del metrics["rollout/tis_weight_mean"], metrics["rollout/tis_clip_frac"]
    diff = (batch["rollout_log_probs"] - batch["old_log_probs"]).abs() * mask
    metrics["rollout/log_prob_diff_max"] = diff.max().item()
    return metrics


def _for_workers(batch: Batch) -> Batch:
    """What the log-prob and update passes need: the tensors and the processor outputs (``multi_modal_inputs``),
    without the PIL images, prompt ids, ground truths and scores that only generation and the trainer use (no copy)."""
    extras = {key: batch.extras[key] for key in ("multi_modal_inputs",) if key in batch.extras}
    return Batch(batch.tensors, extras)


class RayPPOTrainer:
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
        algo = config.algorithm
        if algo.kl_type == "adaptive":
            self.kl_ctrl = AdaptiveKLController(algo.kl_coef, algo.kl_target, algo.kl_horizon)
        else:
            self.kl_ctrl = FixedKLController(algo.kl_coef)
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
        self.val_generations: list[dict[str, Any]] = []  # the last validation's first samples (for the loggers)

    def init_workers(self, device: str) -> None:
        """Start the Ray workers (process group, FSDP2 actor/ref, vLLM engines)."""
        self.workers = WorkerGroup(self.config, device)
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
        self.peak_flops = peak_flops(self.workers.run_all("device_name")[0])

    # ----------------------------------------------------------------------------------------------- batches
    def _prompt_batch(self, features: dict[str, list], n: int, round_: int = 0, phase: str = "train") -> Batch:
        """Repeat each prompt ``n`` times (consecutively) and give the copies one shared ``uid``; each sample gets
        its own sampling seed (``rollout_seed``, from ``worker.rollout.seed``, the step, ``round_`` and its index)."""
        count = len(features["prompt_ids"])
        order = [i for i in range(count) for _ in range(n)]
        uids = [str(uuid.uuid4()) for _ in range(count)]
        prompts, prompt_mask = _left_pad([features["prompt_ids"][i] for i in order],
                                         self.config.data.max_prompt_length, self.pad_id)
        tensors = TensorDict({"prompts": prompts, "prompt_mask": prompt_mask}, batch_size=[len(order)])
        extras = {key: [features[key][i] for i in order]
                  for key in ("raw_prompt_ids", "images", "multi_modal_inputs", "ground_truth")}
        extras["uid"] = [uids[i] for i in order]
        extras["rollout_seed"] = batch_seeds(self.config.worker.rollout.seed, self.global_step, len(order), round_,
                                             phase)
        return Batch(tensors, extras)

    def _generate(self, prompts: Batch, overrides: Optional[dict[str, Any]], timing: dict[str, float]) -> Batch:
        """Sample a response for every prompt on the workers and assemble the full batch."""
        rollout_cfg = self.config.worker.rollout
        outputs = self.workers.run_split("generate_sequences", prompts, overrides=overrides)
        response_ids = [ids for out in outputs for ids in out["response_ids"]]
        timing["reshard"] = timing.get("reshard", 0.0) + max(out["timing_s/reshard"] for out in outputs)
        responses, response_mask = _right_pad(response_ids, rollout_cfg.response_length, self.pad_id, torch.long)
        batch = Batch(prompts.tensors.clone(), dict(prompts.extras))
        batch["responses"] = responses
        batch["response_mask"] = response_mask
        batch["input_ids"] = torch.cat([prompts["prompts"], responses], dim=1)
        batch["attention_mask"] = torch.cat([prompts["prompt_mask"], response_mask], dim=1)
        if outputs[0]["response_log_probs"] is not None:
            log_probs = [lp for out in outputs for lp in out["response_log_probs"]]
            batch["rollout_log_probs"] = _right_pad(log_probs, rollout_cfg.response_length, 0.0, torch.float32)[0]
        return batch

    def _reward_inputs(self, batch: Batch) -> list[dict[str, Any]]:
        """The reward function's inputs: decoded response, its length in tokens, ground truth."""
        lengths = batch["response_mask"].sum(-1).tolist()
        skip = self.config.worker.reward.skip_special_tokens
        texts = self.tokenizer.batch_decode(
            [row[:n].tolist() for row, n in zip(batch["responses"], lengths)], skip_special_tokens=skip
        )
        return [{"response": text, "response_length": int(n), "ground_truth": gt}
                for text, n, gt in zip(texts, lengths, batch["ground_truth"])]

    @staticmethod
    def _set_scores(batch: Batch, scores: dict[str, list[float]]) -> None:
        """Put ``token_level_scores`` (bsz, resp_len) and each named score (``score/<name>``, a list) in the batch."""
        overall = torch.tensor(scores["overall"], dtype=torch.float32)
        batch["token_level_scores"] = scores_to_token_rewards(overall, batch["response_mask"])
        for name, values in scores.items():
            batch[f"score/{name}"] = values

    def _reward(self, batch: Batch, guard: GuardedReward) -> dict[str, list[float]]:
        """Score every response here and now (see ``_set_scores``) through ``guard`` (``worker.reward.on_error``,
        ``timeout_s``); adds the failed samples to ``_reward_errors``; returns the named scores.

        Raises:
            RewardSampleError: the function failed on a sample and ``on_error`` is ``raise``.
        """
        scores, failures = guard(self._reward_inputs(batch), self.global_step)
        self._reward_errors += len(failures)
        self._set_scores(batch, scores)
        return scores

    def _reward_async(self, batch: Batch) -> ray.ObjectRef:
        """Start scoring ``batch`` with ``self.reward_fn`` in the reward actor; collect with ``_reward_wait``."""
        if self._scorer is None:
            self._scorer = ray.remote(RewardScorer).options(num_cpus=0).remote()
        fn, cfg = self.reward_fn, self.config.worker.reward
        return self._scorer.score_guarded.remote(fn.spec, fn.kwargs, fn.reward_type, self._reward_inputs(batch),
                                                 cfg.on_error, cfg.timeout_s, self.global_step)

    def _reward_wait(self, batch: Batch, pending: ray.ObjectRef, order: list[int]) -> None:
        """Wait for the scores of the batch as generated and set them on ``batch`` (reordered by ``order``)."""
        try:
            scores, failures = ray.get(pending)
        except ray.exceptions.RayTaskError as e:  # the reward function's own error, not Ray's wrapper
            raise e.as_instanceof_cause() from None
        self._reward_errors += len(failures)
        self._set_scores(batch, {name: [values[i] for i in order] for name, values in scores.items()})

    def _compute_advantage(self, batch: Batch) -> None:
        algo = self.config.algorithm
        estimator = get_adv_estimator(algo.adv_estimator)
        advantages, returns = estimator(
            batch["token_level_rewards"], batch["response_mask"], np.array(batch["uid"], dtype=object),
            gamma=algo.gamma, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            reward_baselines=batch["reward_baselines"] if "reward_baselines" in batch else None,
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

    # ----------------------------------------------------------------------------------------------- checkpoints
    @staticmethod
    def _step_of(path: str) -> int:
        return int(os.path.basename(os.path.normpath(path)).rsplit("_", 1)[-1])

    def _checkpoint_to_resume(self) -> Optional[str]:
        return checkpoint_to_resume(self.config.trainer)

    def save_checkpoint(self, metrics: Optional[dict[str, float]] = None) -> str:
        """Save the whole training state as ``global_step_<N>`` under ``trainer.save_checkpoint_path`` (atomic; see
        ``easyrl.trainer.checkpoint``) and apply ``trainer.save_limit``; ``metrics`` of this step rank it by
        ``trainer.best_metric``. Returns the checkpoint folder."""
        trainer = self.config.trainer

        def write(tmp: str) -> None:
            self.workers.run_all("save_checkpoint", tmp)
            torch.save(self.state_dict(), os.path.join(tmp, TRAINER_STATE))

        metric = (metrics or {}).get(trainer.best_metric)
        self.last_checkpoint = commit_checkpoint(
            trainer.save_checkpoint_path, self.global_step, write, metric=metric, metric_name=trainer.best_metric,
            mode=trainer.best_metric_mode, save_limit=trainer.save_limit,
        )
        logger.info("checkpoint saved: %s", self.last_checkpoint)
        return self.last_checkpoint

    def load_checkpoint(self, path: str) -> None:
        """Restore the training state saved by :meth:`save_checkpoint` (workers and this process)."""
        self.workers.run_all("load_checkpoint", path)
        self.load_state_dict(torch.load(os.path.join(path, TRAINER_STATE), weights_only=False))
        self.last_checkpoint = path
        logger.info("resumed from %s at step %d", path, self.global_step)

    def state_dict(self) -> dict[str, Any]:
        """This process's part of the training state: step, prompt-stream position, KL coefficient, RNG states."""
        return {"global_step": self.global_step, "prompt_stream": self.train_dataloader.state_dict(),
                "kl_coef": self.kl_ctrl.value, "rng": get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (before iterating over the prompts)."""
        self.global_step = state["global_step"]
        self.train_dataloader.load_state_dict(state["prompt_stream"])
        self.kl_ctrl.value = state["kl_coef"]
        set_rng_state(state["rng"])

    def prompt_stream(self) -> Iterator[dict[str, list]]:
        """Batches of ``data.rollout_batch_size`` prompts, epoch after epoch (reshuffled each epoch), from the
        current position of ``train_dataloader`` (a ``PromptStream``)."""
        return iter(self.train_dataloader)

    def _should_validate(self) -> bool:
        freq = self.config.trainer.val_freq
        last = self.global_step == self.training_steps
        return self.val_dataset is not None and freq > 0 and (self.global_step % freq == 0 or last)

    def train_step(self, prompt_stream: Iterator[dict[str, list]]) -> dict[str, float]:
        """One step of GRPO-style RL on the next batch of prompts; returns the step's metrics."""
        cfg = self.config
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        with timer("step", timing):
            batch, pending = self._make_batch(prompt_stream, timing, metrics)  # gen (+ reward, dynamic sampling)
            order = self._balance(batch, metrics)
            batch = batch.select(order)  # rank r gets the r-th equal share: about as many tokens as the others
            on_policy = cfg.on_policy_update
            if not on_policy:
                with timer("old_log_prob", timing):
                    old = self.workers.run_split("compute_log_probs", _for_workers(batch))
                    batch["old_log_probs"] = torch.cat(old, dim=0)
                if "rollout_log_probs" in batch:
                    metrics.update(rollout_mismatch_metrics(batch))
            if self.workers_need_ref():
                with timer("ref", timing):
                    ref = self.workers.run_split("compute_ref_log_probs", _for_workers(batch))
                    batch["ref_log_probs"] = torch.cat(ref, dim=0)
            if pending is not None:  # scored in the reward actor while the log-prob passes ran
                with timer("reward", timing):
                    self._reward_wait(batch, pending, order)
            for key in [key for key in batch.extras if key.startswith("score/")]:  # unless set over all generated
                metrics.setdefault(key.replace("score/", "reward/", 1), float(np.mean(batch[key])))
            metrics["reward/errors"] = float(self._reward_errors)
            metrics["reward/frac_reward_zero_std"] = self._check_reward_variance(batch)
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
            with timer("update_actor", timing):
                worker_metrics = self.workers.run_split("update_actor", _for_workers(batch))
            if on_policy:  # the update's own (pre-step) log-probs are the old ones
                batch["old_log_probs"] = torch.cat([m.pop("old_log_probs") for m in worker_metrics], dim=0)
                if "rollout_log_probs" in batch:
                    metrics.update(rollout_mismatch_metrics(batch))
            merged = defaultdict(list)
            for per_worker in worker_metrics:
                for key, values in per_worker.items():
                    merged[key].extend(values)
            metrics.update(reduce_metrics(merged))
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

    def _check_reward_variance(self, batch: Batch) -> float:
        """``frac_reward_zero_std`` of the training batch; warns when every group's rewards are equal."""
        scores = batch["token_level_scores"].sum(-1).tolist()
        frac = frac_reward_zero_std(scores, batch["uid"])
        if frac == 1.0:
            logger.warning(constant_reward_warning(self.global_step, len(set(batch["uid"])), scores))
        return frac

    def _make_batch(self, prompt_stream: Iterator[dict[str, list]], timing: dict[str, float],
                    metrics: dict[str, float]) -> tuple[Batch, Optional[ray.ObjectRef]]:
        """Generate and score ``data.rollout_batch_size`` groups of ``n`` samples. Returns the batch and, without
        online filtering, the pending scores (the reward actor is still scoring: see ``_reward_wait``); with it the
        batch is scored already and the second value is None.

        With ``algorithm.online_filtering`` (DAPO dynamic sampling, Yu et al. 2025 sec. 3.2) groups whose
        ``filter_key`` scores are all equal, or whose mean is outside [filter_low, filter_high], are dropped and
        more prompts are generated until enough groups are kept (``max_try_make_batch`` rounds at most); metrics
        ``dynamic_sampling/{num_gen_batches,groups_kept,groups_dropped}``. ``reward/<name>`` is the mean over every
        generated sample, dropped groups included (as EasyR1 logs it): the policy's reward, not the filter's.

        Raises:
            RuntimeError: ``max_try_make_batch`` rounds did not yield enough groups.
        """
        cfg, algo = self.config, self.config.algorithm
        n, wanted = cfg.worker.rollout.n, cfg.data.rollout_batch_size
        kept: list[Batch] = []
        num_kept, rounds, dropped = 0, 0, 0
        self._reward_errors = 0
        generated: dict[str, list[float]] = defaultdict(list)  # every sample's named scores, for reward/*
        while num_kept < wanted:
            rounds += 1
            if algo.online_filtering and algo.max_try_make_batch > 0 and rounds > algo.max_try_make_batch:
                raise RuntimeError(
                    f"Dynamic sampling kept {num_kept} of {wanted} groups after {algo.max_try_make_batch} generation "
                    f"rounds (algorithm.max_try_make_batch): the rewards barely vary. Widen algorithm.filter_low/"
                    f"filter_high, raise max_try_make_batch, or turn algorithm.online_filtering off."
                )
            prompts = self._prompt_batch(next(prompt_stream), n, round_=rounds - 1)
            with timer("gen", timing):
                batch = self._generate(prompts, overrides=None, timing=timing)
            pending = None
            if not algo.online_filtering and isinstance(self.reward_fn, RewardFunction):
                pending = self._reward_async(batch)  # scored while the log-prob passes run
            else:  # filtering needs the scores now (and a plain callable cannot be shipped by spec)
                with timer("reward", timing):
                    for name, values in self._reward(batch, self._guard).items():
                        generated[name].extend(values)
                metrics.update({f"reward/{name}": float(np.mean(values)) for name, values in generated.items()})
            if algo.adv_estimator == "remax":
                with timer("gen_baseline", timing):
                    batch["reward_baselines"] = self._greedy_baselines(prompts)
            if not algo.online_filtering:
                return batch, pending
            if f"score/{algo.filter_key}" not in batch:
                names = sorted(k.split("/", 1)[1] for k in batch.extras if k.startswith("score/"))
                raise ValueError(f"algorithm.filter_key={algo.filter_key!r} is not a score of the reward function "
                                 f"(it returns {', '.join(names)}).")
            keep = select_groups(np.array(batch[f"score/{algo.filter_key}"]), np.array(batch["uid"], dtype=object),
                                 filter_low=algo.filter_low, filter_high=algo.filter_high)
            dropped += len(set(batch["uid"])) - len(set(u for u, k in zip(batch["uid"], keep) if k))
            if keep.any():
                kept.append(batch.select(np.flatnonzero(keep).tolist()))
                num_kept += int(keep.sum()) // n
        batch = Batch.cat(kept).select(list(range(wanted * n)))  # groups are consecutive: whole groups are kept
        metrics.update({"dynamic_sampling/num_gen_batches": float(rounds),
                        "dynamic_sampling/groups_dropped": float(dropped),
                        "dynamic_sampling/groups_kept": float(num_kept)})
        return batch, None

    def _greedy_baselines(self, prompts: Batch) -> torch.Tensor:
        """ReMax's baseline (Li et al. 2023, Eq. 4): the reward of a greedy response to each prompt, ``(bsz,)``,
        shared by the ``n`` samples of the prompt."""
        n = self.config.worker.rollout.n
        firsts = list(range(0, len(prompts), n))
        firsts_batch = prompts.select(firsts)
        firsts_batch["rollout_seed"] = batch_seeds(self.config.worker.rollout.seed, self.global_step, len(firsts),
                                                   phase="baseline")
        greedy = self._generate_even(firsts_batch, overrides={"temperature": 0.0})
        scores = self._reward(greedy, self._guard)["overall"]
        return torch.tensor(scores, dtype=torch.float32).repeat_interleave(n)

    def _generate_even(self, prompts: Batch, overrides: Optional[dict[str, Any]]) -> Batch:
        """``_generate`` for any number of prompts: pads with copies of the first prompts so that every worker gets
        an equal share, and drops their responses again."""
        real = len(prompts)
        pad = (-real) % self.workers.world_size
        if pad:
            prompts = Batch.cat([prompts, prompts.select([i % real for i in range(pad)])])
        return self._generate(prompts, overrides=overrides, timing={}).select(list(range(real)))

    def workers_need_ref(self) -> bool:
        """Whether a KL term (loss or in-reward) needs reference log-probs this step."""
        return self.config.algorithm.needs_reference

    # ----------------------------------------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """Generate on the whole validation set with ``worker.rollout.val_override_config``; mean of every reward
        name as ``val/reward/<name>``, plus ``val/response_length/mean`` and ``timing_s/validation``."""
        cfg = self.config
        overrides = dict(cfg.worker.rollout.val_override_config)
        n = int(overrides.pop("n", 1))
        timing: dict[str, float] = {}
        sums: dict[str, list[float]] = defaultdict(list)
        lengths: list[float] = []
        batch_size = cfg.data.val_batch_size if cfg.data.val_batch_size > 0 else len(self.val_dataset)
        loader = DataLoader(self.val_dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_fn)
        self.val_generations = []
        with timer("validation", timing):
            for round_, features in enumerate(loader):
                batch = self._generate_even(self._prompt_batch(features, n, round_=round_, phase="val"),
                                            overrides=overrides)
                for name, values in self._reward(batch, self._val_guard).items():
                    sums[name].extend(values)
                lengths.extend(batch["response_mask"].sum(-1).float().tolist())
                self._keep_generations(batch)
        metrics = {f"val/reward/{name}": float(np.mean(values)) for name, values in sums.items()}
        metrics["val/response_length/mean"] = float(np.mean(lengths))
        metrics["timing_s/validation"] = timing["validation"]
        return metrics

    def _keep_generations(self, batch: Batch) -> None:
        """Adds ``batch``'s first samples to ``val_generations`` until ``trainer.val_generations_to_log`` are kept."""
        wanted = self.config.trainer.val_generations_to_log - len(self.val_generations)
        self.val_generations.extend(generation_rows(self.tokenizer, batch, wanted))

    def save_model(self) -> str:
        """Export the actor in Hugging Face format to ``trainer.save_model_path`` (default ``<run_dir>/huggingface``;
        see ``easyrl.export``)."""
        path = self.config.trainer.save_model_path or os.path.join(self.config.trainer.run_dir, "huggingface")
        self.workers.run_all("save_hf", path)
        logger.info("actor exported to %s", path)
        return path
