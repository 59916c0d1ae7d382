"""Rollout correction: truncated importance sampling between the rollout engine's and the trainer's log-probs."""

from __future__ import annotations

import torch

from easyrl.algorithms.masked_ops import masked_mean
from easyrl.algorithms.policy_losses import LOG_RATIO_CLAMP

__all__ = ["compute_tis_weights"]


@torch.no_grad()
def compute_tis_weights(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance-sampling weights correcting the rollout engine / trainer mismatch (Yao et al. 2025,
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", blog,
    https://fengyao.notion.site/off-policy-rl): the rollout engine (vLLM) samples from ``pi_rollout`` while the
    loss assumes ``pi_old`` (the trainer's recomputation), so each token is reweighted by
    ``w = min(pi_old / pi_rollout, cap)``.

    Args:
        old_log_prob: ``(bsz, resp_len)`` log-probs recomputed by the trainer before the update.
        rollout_log_probs: ``(bsz, resp_len)`` log-probs reported by the rollout engine for the same tokens.
        response_mask: ``(bsz, resp_len)`` ``{0, 1}``.
        cap: truncation ``C`` > 0 (the blog uses 2).

    Returns:
        ``(weights, metrics)``: ``weights`` ``(bsz, resp_len)`` detached, 0 outside the mask; metrics (floats):

        * ``rollout/tis_weight_mean``: masked mean of the truncated weights;
        * ``rollout/tis_clip_frac``: fraction of valid tokens whose raw weight exceeded ``cap``;
        * ``rollout/probs_diff_mean`` / ``rollout/probs_diff_max``: masked mean / max of
          ``|exp(rollout_logp) - exp(old_logp)|``, the token-probability gap;
        * ``rollout/log_ppl_diff``: mean over non-empty sequences of
          ``mean_t(rollout_logp) - mean_t(old_logp) = log PPL_old - log PPL_rollout`` (> 0: the trainer finds the
          rollouts less likely than the engine did).

    Raises:
        ValueError: if ``cap <= 0``.
    """
    if cap <= 0:
        raise ValueError(f"compute_tis_weights: cap must be > 0, got {cap}")
    valid = response_mask.bool()
    log_w = torch.clamp(old_log_prob - rollout_log_probs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    raw = torch.exp(log_w)
    weights = torch.where(valid, raw.clamp(max=cap), torch.zeros_like(raw))
    probs_diff = torch.where(valid, (torch.exp(rollout_log_probs) - torch.exp(old_log_prob)).abs(), 0.0)
    seq_valid = valid.any(dim=-1)
    seq_diff = masked_mean(rollout_log_probs, valid, dim=-1) - masked_mean(old_log_prob, valid, dim=-1)
    metrics = {
        "rollout/tis_weight_mean": float(masked_mean(weights, valid)),
        "rollout/tis_clip_frac": float(masked_mean((raw > cap).float(), valid)),
        "rollout/probs_diff_mean": float(masked_mean(probs_diff, valid)),
        "rollout/probs_diff_max": float(probs_diff.max()) if probs_diff.numel() else 0.0,
        "rollout/log_ppl_diff": float(masked_mean(seq_diff, seq_valid)),
    }
    return weights, metrics
