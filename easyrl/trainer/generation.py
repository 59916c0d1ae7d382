"""The trainer's generation phase: prompt batches, trajectories from the rollout, DAPO dynamic sampling and ReMax's
greedy baselines."""

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
from easyrl.trainer.metrics import timer
from easyrl.trainer.rollout import Rollout, left_pad
from easyrl.trainer.scoring import Scorer
from easyrl.trainer.seeding import batch_seeds

__all__ = ["Generator"]


class Generator:
    """Makes the step's batch of ``config`` (a ``PPOConfig``): prompts -> trajectories (``rollout``) -> scores
    (``scorer``), with dynamic sampling and ReMax baselines as configured."""

    def __init__(self, config, rollout: Rollout, scorer: Scorer, pad_id: int):
        self.config = config
        self.rollout = rollout
        self.scorer = scorer
        self.pad_id = pad_id

    def prompt_batch(self, features: dict[str, list], n: int, step: int, round_: int = 0,
                     phase: str = "train") -> Batch:
        """Each prompt repeated ``n`` times with one shared ``uid``, each sample its own ``rollout_seed``
        (``easyrl.trainer.seeding``)."""
        count = len(features["prompt_ids"])
        order = [i for i in range(count) for _ in range(n)]
        uids = [str(uuid.uuid4()) for _ in range(count)]
        prompts, prompt_mask = left_pad([features["prompt_ids"][i] for i in order],
                                         self.config.data.max_prompt_length, self.pad_id)
        tensors = TensorDict({"prompts": prompts, "prompt_mask": prompt_mask}, batch_size=[len(order)])
        extras = {key: [features[key][i] for i in order]
                  for key in ("raw_prompt_ids", "images", "videos", "multi_modal_inputs", "ground_truth", "columns")
                  if key in features}
        extras["uid"] = [uids[i] for i in order]
        extras["rollout_seed"] = batch_seeds(self.config.worker.rollout.seed, step, len(order), round_, phase)
        return Batch(tensors, extras)

    def generate(self, prompts: Batch, overrides: Optional[dict[str, Any]], timing: dict[str, float]) -> Batch:
        """The rollout's trajectories of ``prompts``; adds the weight sync's seconds to ``timing["reshard"]``."""
        batch, reshard = self.rollout.generate(prompts, overrides)
        timing["reshard"] = timing.get("reshard", 0.0) + reshard
        return batch

    def generate_even(self, prompts: Batch, overrides: Optional[dict[str, Any]]) -> Batch:
        """:meth:`generate` for any number of prompts (padded to an equal share per engine, the copies dropped)."""
        real = len(prompts)
        padded = prompts.padded_to_multiple(self.rollout.engines)
        return self.generate(padded, overrides=overrides, timing={}).select(list(range(real)))

    def make_batch(self, prompt_stream: Iterator[dict[str, list]], step: int, timing: dict[str, float],
                   metrics: dict[str, float], groups: Optional[int] = None,
                   first_round: int = 0) -> tuple[Batch, Optional[ray.ObjectRef], dict[str, list[float]], int]:
        """Generate and score ``groups`` (default ``data.rollout_batch_size``) groups of ``n`` samples for step
        ``step``, in rounds of ``data.mini_rollout_batch_size`` prompts numbered from ``first_round`` (the seeds').
        Returns ``(batch, pending, scores, failures)``: ``pending`` the reward actor's scores still computing or None,
        ``scores`` every generated sample's named scores when scored here (dropped groups included), ``failures`` the
        samples the reward function failed on.

        With ``algorithm.online_filtering`` (DAPO dynamic sampling, Yu et al. 2025 sec. 3.2) groups whose
        ``filter_key`` scores are all equal or whose mean is outside [filter_low, filter_high] are dropped until
        enough are kept; metrics ``dynamic_sampling/*``. Raises ``RuntimeError`` when ``max_try_make_batch`` rounds
        did not yield enough groups, ``ValueError`` when ``filter_key`` is not a score of the reward function.
        """
        cfg, algo = self.config, self.config.algorithm
        n, wanted = cfg.worker.rollout.n, groups or cfg.data.rollout_batch_size
        one_round = not algo.online_filtering and cfg.data.generation_batch_size == wanted  # else: rounds are kept
        kept: list[Batch] = []
        num_kept, rounds, dropped, failures = 0, 0, 0, 0
        generated: dict[str, list[float]] = defaultdict(list)  # every sample's named scores, for reward/*
        while num_kept < wanted:
            rounds += 1
            if algo.online_filtering and algo.max_try_make_batch > 0 and rounds > algo.max_try_make_batch:
                raise RuntimeError(
                    f"Dynamic sampling kept {num_kept} of {wanted} groups after {algo.max_try_make_batch} generation "
                    f"rounds (algorithm.max_try_make_batch): the rewards barely vary. Widen algorithm.filter_low/"
                    f"filter_high, raise max_try_make_batch, or turn algorithm.online_filtering off."
                )
            prompts = self.prompt_batch(next(prompt_stream), n, step, round_=first_round + rounds - 1)
            with timer("gen", timing):
                batch = self.generate(prompts, overrides=None, timing=timing)
            pending = None
            if one_round and self.scorer.can_score_async:
                pending = self.scorer.score_async(batch, step)  # scored while the log-prob passes run
            else:  # filtering needs the scores now (and a plain callable cannot be shipped by spec)
                with timer("reward", timing):
                    scores, failed = self.scorer.score(batch, step)
                failures += failed
                for name, values in scores.items():
                    generated[name].extend(values)
            if algo.estimator("needs_reward_baselines"):  # ReMax: the greedy response's reward
                with timer("gen_baseline", timing):
                    batch["reward_baselines"], failed = self.greedy_baselines(prompts, step)
                failures += failed
            if one_round:
                return batch, pending, generated, failures
            if not algo.online_filtering:  # data.mini_rollout_batch_size rounds, each kept whole
                kept.append(batch)
                num_kept += len(batch) // n
                continue
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
        return batch, None, generated, failures

    def greedy_baselines(self, prompts: Batch, step: int) -> tuple[torch.Tensor, int]:
        """ReMax's baseline (Li et al. 2023, Eq. 4): each prompt's greedy reward repeated ``n`` times, ``(bsz,)``, and
        the number of greedy responses the reward function failed on."""
        n = self.config.worker.rollout.n
        firsts = prompts.select(list(range(0, len(prompts), n)))
        firsts["rollout_seed"] = batch_seeds(self.config.worker.rollout.seed, step, len(firsts), phase="baseline")
        greedy = self.generate_even(firsts, overrides={"temperature": 0.0})
        scores, failures = self.scorer.score(greedy, step)
        return torch.tensor(scores["overall"], dtype=torch.float32).repeat_interleave(n), failures
