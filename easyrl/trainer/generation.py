"""The trainer's generation phase: prompt batches (each prompt repeated ``n`` times, one ``uid`` per group, a sampling
seed per sample), vLLM generation on the workers into the padded batch layout, DAPO dynamic sampling (generate until
enough groups vary), and ReMax's greedy baselines.

``GenerationMixin`` is a part of :class:`~easyrl.trainer.ray_trainer.RayPPOTrainer`; it uses the trainer's ``config``,
``workers``, ``pad_id``, ``global_step``, ``reward_fn``, ``_guard`` and its scoring methods
(:class:`~easyrl.trainer.scoring.ScoringMixin`).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
import ray
import torch
from tensordict import TensorDict

from easyrl.algorithms.dynamic_sampling import select_groups
from easyrl.batch import Batch
from easyrl.rewards.function import RewardFunction
from easyrl.trainer.batch_layout import for_rollout, left_pad, right_pad
from easyrl.trainer.metrics import timer
from easyrl.trainer.seeding import batch_seeds
from easyrl.workers.fsdp_worker import FSDPWorker

__all__ = ["GenerationMixin"]


class GenerationMixin:
    """Generating the step's batch (see the module docstring)."""

    def _prompt_batch(self, features: dict[str, list], n: int, round_: int = 0, phase: str = "train") -> Batch:
        """Repeat each prompt ``n`` times (consecutively) and give the copies one shared ``uid``; each sample gets
        its own sampling seed (``rollout_seed``, from ``worker.rollout.seed``, the step, ``round_`` and its index)."""
        count = len(features["prompt_ids"])
        order = [i for i in range(count) for _ in range(n)]
        uids = [str(uuid.uuid4()) for _ in range(count)]
        prompts, prompt_mask = left_pad([features["prompt_ids"][i] for i in order],
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
        # one result per engine; vLLM takes the images, not the processor outputs
        outputs = self.workers.run_rollout(FSDPWorker.generate_sequences, for_rollout(prompts), overrides=overrides)
        response_ids = [ids for out in outputs for ids in out["response_ids"]]
        timing["reshard"] = timing.get("reshard", 0.0) + max(out["timing_s/reshard"] for out in outputs)
        responses, response_mask = right_pad(response_ids, rollout_cfg.response_length, self.pad_id, torch.long)
        batch = Batch(prompts.tensors.clone(), dict(prompts.extras))
        batch["responses"] = responses
        batch["response_mask"] = response_mask
        batch["input_ids"] = torch.cat([prompts["prompts"], responses], dim=1)
        batch["attention_mask"] = torch.cat([prompts["prompt_mask"], response_mask], dim=1)
        if outputs[0]["response_log_probs"] is not None:
            log_probs = [lp for out in outputs for lp in out["response_log_probs"]]
            batch["rollout_log_probs"] = right_pad(log_probs, rollout_cfg.response_length, 0.0, torch.float32)[0]
        return batch

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
        """``_generate`` for any number of prompts: pads with copies of the first prompts so that every vLLM engine
        gets an equal share, and drops their responses again."""
        real = len(prompts)
        pad = (-real) % self.workers.rollout_dp_size
        if pad:
            prompts = Batch.cat([prompts, prompts.select([i % real for i in range(pad)])])
        return self._generate(prompts, overrides=overrides, timing={}).select(list(range(real)))
