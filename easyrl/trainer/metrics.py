"""Per-step metrics with the field's standard names (docs/metrics.md)."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from typing import Optional

import numpy as np
import torch

from easyrl.algorithms.rollout_correction import compute_tis_weights, log_prob_diff_median
from easyrl.batch import Batch


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def compute_data_metrics(batch: Batch, max_prompt_length: int, max_response_length: int) -> dict[str, float]:
    """``critic/{score,rewards,advantages,returns}/{mean,max,min}`` (scores and rewards summed per sequence, the
    others over valid tokens), ``response_length/*``, ``prompt_length/*`` (``clip_ratio``: the share at the maximum);
    with a critic ``critic/values/*`` and ``critic/vf_explained_var`` (``1 - var(R - V) / var(R)``)."""
    mask = batch["response_mask"].bool()
    response_length = mask.sum(-1).float()
    prompt_length = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1).float()
    metrics = {}
    metrics.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", batch["advantages"][mask]))
    metrics.update(_stats("critic/returns", batch["returns"][mask]))
    if "values" in batch:  # PPO with a critic: what the critic predicted, and how much of the returns it explains
        values, returns = batch["values"][mask], batch["returns"][mask]
        metrics.update(_stats("critic/values", values))
        metrics["critic/vf_explained_var"] = (1.0 - (returns - values).var() / (returns.var() + 1e-5)).item()
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (response_length >= max_response_length).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = (prompt_length >= max_prompt_length).float().mean().item()
    return metrics


def compute_throughput_metrics(batch: Batch, step_seconds: float, world_size: int,
                               timing: Optional[dict[str, float]] = None, ppo_epochs: int = 1) -> dict[str, float]:
    """``perf/total_num_tokens`` (prompt + response), ``perf/time_per_step`` (s), ``perf/throughput`` (tokens/s per
    device), ``perf/throughput_total``; with ``timing`` (seconds per phase) ``perf/rollout_tokens_per_s`` (response
    tokens / ``gen``) and ``perf/update_tokens_per_s`` (``ppo_epochs`` x tokens / ``update_actor``)."""
    total_tokens = int(batch["attention_mask"].sum().item())
    seconds = max(step_seconds, 1e-9)
    metrics = {
        "perf/total_num_tokens": float(total_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_tokens / seconds / world_size,
        "perf/throughput_total": total_tokens / seconds,
    }
    timing = timing or {}
    if timing.get("gen", 0) > 0:
        metrics["perf/rollout_tokens_per_s"] = float(batch["response_mask"].sum().item()) / timing["gen"]
    if timing.get("update_actor", 0) > 0:
        metrics["perf/update_tokens_per_s"] = ppo_epochs * total_tokens / timing["update_actor"]
    return metrics


def reward_metrics(batch: Batch, generated: dict[str, list[float]], failures: int,
                   frac_zero_std: Optional[float] = None) -> dict[str, float]:
    """Every ``reward/*`` metric: ``reward/<name>``, the mean of each named score (``score/<name>`` of ``batch``), over
    every ``generated`` sample where the generator kept them (dynamic sampling: dropped groups included), else over
    ``batch``; ``reward/errors``: ``failures``, the samples the reward function failed on; and, when given,
    ``reward/frac_reward_zero_std`` (:func:`frac_reward_zero_std` of the batch)."""
    names = [key.removeprefix("score/") for key in batch.extras if key.startswith("score/")]
    metrics = {f"reward/{name}": float(np.mean(generated.get(name) or batch[f"score/{name}"])) for name in names}
    metrics["reward/errors"] = float(failures)
    if frac_zero_std is not None:
        metrics["reward/frac_reward_zero_std"] = frac_zero_std
    return metrics


def frac_reward_zero_std(scores: Sequence[float], uids: Sequence[str]) -> float:
    """Fraction of groups (samples sharing a ``uid``; ``scores``, ``uids``: ``(bsz,)``) whose scores are all equal:
    their group-normalised advantage is 0. ``ValueError`` when they differ in length or are empty."""
    if len(scores) != len(uids) or len(scores) == 0:
        raise ValueError(f"frac_reward_zero_std needs one uid per score; got {len(scores)} scores, {len(uids)} uids.")
    groups: dict[str, list[float]] = defaultdict(list)
    for uid, score in zip(uids, scores):
        groups[uid].append(float(score))
    constant = sum(max(values) == min(values) for values in groups.values())
    return constant / len(groups)


def generation_rows(tokenizer, batch: Batch, count: int) -> list[dict]:
    """The first ``count`` samples of a scored batch as ``{"prompt", "response", "ground_truth", "score"}`` (and
    ``judge_verdict`` when judged), decoded without special tokens; tokens outside ``response_mask`` (tool turns)
    are shown as ``<masked>...</masked>``."""
    rows = list(range(min(max(count, 0), len(batch))))
    if not rows:
        return []
    prompts = tokenizer.batch_decode(batch["prompts"][rows], skip_special_tokens=True)
    lengths = batch["attention_mask"][:, -batch["responses"].shape[1]:].sum(-1).tolist()  # tool turns included
    table = []
    for i, prompt in zip(rows, prompts):
        spans = itertools.groupby(zip(batch["responses"][i, : lengths[i]].tolist(),
                                      batch["response_mask"][i, : lengths[i]].tolist()), key=lambda pair: pair[1])
        texts = [(trained, tokenizer.decode([t for t, _ in span], skip_special_tokens=True)) for trained, span in spans]
        response = "".join(text if trained else f"<masked>{text}</masked>" for trained, text in texts)
        table.append({"prompt": prompt, "response": response, "ground_truth": str(batch["ground_truth"][i]),
                      "score": float(batch["score/overall"][i])})
        if "judge_verdict" in batch:
            table[-1]["judge_verdict"] = batch["judge_verdict"][i]
    return table


# per-worker values that are reduced by their maximum, not their mean (peaks over the workers)
MAX_REDUCED_PREFIXES = ("perf/max_memory_", "perf/cpu_memory_")


def reduce_metrics(*metrics: dict[str, Iterable[float]]) -> dict[str, float]:
    """Mean of each metric's values in all of ``metrics`` (e.g. one dict per worker, a list of micro-batch values
    per key); the maximum for the memory peaks (keys starting with ``MAX_REDUCED_PREFIXES``)."""
    merged: dict[str, list[float]] = defaultdict(list)
    for each in metrics:
        for key, values in each.items():
            merged[key].extend(values)
    return {key: float(np.max(values) if key.startswith(MAX_REDUCED_PREFIXES) else np.mean(values))
            for key, values in merged.items()}


# Metrics measured from the machine (the clock, the allocator, the process's memory) rather than computed from the
# batch: a resumed or repeated run with the same seed reproduces every other metric exactly, but not these.
MEASURED_PREFIXES = (
    "timing_s/", "perf/time_per_step", "perf/throughput", "perf/rollout_tokens_per_s", "perf/update_tokens_per_s",
    "perf/mfu/", "perf/max_memory_", "perf/cpu_memory_",
)


@contextmanager
def timer(name: str, timing: dict[str, float]):
    """Adds the seconds spent in the block to ``timing[name]``."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def rollout_mismatch_metrics(batch: Batch) -> dict[str, float]:
    """How far vLLM's sampled-token log-probs are from the actor's: ``rollout/probs_diff_{mean,max}``,
    ``rollout/log_ppl_diff`` (``compute_tis_weights``), ``rollout/log_prob_diff_{max,median}`` over valid tokens."""
    mask = batch["response_mask"]
    _, metrics = compute_tis_weights(batch["old_log_probs"], batch["rollout_log_probs"], mask, cap=float("inf"))
    del metrics["rollout/tis_weight_mean"], metrics["rollout/tis_clip_frac"]
    diff = (batch["rollout_log_probs"] - batch["old_log_probs"]).abs() * mask
    metrics["rollout/log_prob_diff_max"] = diff.max().item()
    metrics["rollout/log_prob_diff_median"] = log_prob_diff_median(batch["old_log_probs"], batch["rollout_log_probs"],
                                                                    mask)
    return metrics
