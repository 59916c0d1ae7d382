"""Per-step metrics with the field's standard names (verl / EasyR1)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from easyrl.batch import Batch


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(), f"{prefix}/min": values.min().item()}


def compute_data_metrics(batch: Batch, max_prompt_length: int, max_response_length: int) -> dict[str, float]:
    """``critic/{score,rewards,advantages,returns}/{mean,max,min}``, ``response_length/*``, ``prompt_length/*``.

    Scores and rewards are per sequence (sum over tokens); advantages and returns are over valid response tokens.
    ``*/clip_ratio`` is the fraction of samples that reached the maximum length.
    """
    mask = batch["response_mask"].bool()
    response_length = mask.sum(-1).float()
    prompt_length = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1).float()
    metrics = {}
    metrics.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", batch["advantages"][mask]))
    metrics.update(_stats("critic/returns", batch["returns"][mask]))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (response_length >= max_response_length).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = (prompt_length >= max_prompt_length).float().mean().item()
    return metrics


def compute_throughput_metrics(batch: Batch, step_seconds: float, world_size: int) -> dict[str, float]:
    """``perf/total_num_tokens`` (prompt + response tokens of the step), ``perf/time_per_step`` (seconds) and
    ``perf/throughput`` (tokens per second per device)."""
    total_tokens = int(batch["attention_mask"].sum().item())
    return {
        "perf/total_num_tokens": float(total_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_tokens / max(step_seconds, 1e-9) / world_size,
    }


def reduce_metrics(metrics: dict[str, Iterable[float]]) -> dict[str, float]:
    """Mean of each metric's values (e.g. over micro-batches and workers)."""
    return {key: float(np.mean(list(values))) for key, values in metrics.items()}
