"""Rollout correction between the rollout engine's and the trainer's log-probs: truncated IS (``tis_cap``),
token/sequence IS and IcePop, rejection sampling, and the gap the weight-sync check reads. All tensors are
``(bsz, resp_len)``; ``log_ratio`` is ``old_log_prob - rollout_log_probs``, clamped to [-20, 20] before ``exp``."""

from __future__ import annotations

import math

import torch

from easyrl.algorithms.masked_ops import masked_mean, masked_sum
from easyrl.algorithms.policy_losses import LOG_RATIO_CLAMP

__all__ = ["ROLLOUT_IS_LEVELS", "ROLLOUT_RS_OPTIONS", "compute_rollout_correction_weights", "correct_rollout",
           "compute_rollout_rejection_mask", "compute_tis_weights", "log_prob_diff_median", "parse_rs_thresholds"]


@torch.no_grad()
def compute_tis_weights(old_log_prob: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor,
                        cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated IS (Yao et al. 2025, fengyao.notion.site/off-policy-rl): ``w = min(pi_old / pi_rollout, cap)``, 0
    outside the mask. Metrics: ``rollout/tis_weight_mean``, ``rollout/tis_clip_frac`` (share of raw weights above
    ``cap``), ``rollout/probs_diff_mean`` / ``_max`` (``|p_rollout - p_old|``), ``rollout/log_ppl_diff`` (mean over
    sequences of ``mean_t(rollout_logp) - mean_t(old_logp)``; > 0: the trainer finds the rollouts less likely).
    ValueError if ``cap <= 0``."""
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


@torch.no_grad()
def log_prob_diff_median(old_log_prob: torch.Tensor, rollout_log_probs: torch.Tensor,
                         response_mask: torch.Tensor) -> float:
    """Median of ``|rollout_log_probs - old_log_prob|`` over valid tokens (nats; 0.0 without one): a few outlier tokens
    cannot move it, stale weights move most."""
    diff = (rollout_log_probs - old_log_prob).abs()[response_mask.bool()]
    return float(diff.float().median()) if diff.numel() else 0.0


ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                      "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


@torch.no_grad()
def compute_rollout_correction_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_is: str = "token",
                                       threshold: float = 2.0, threshold_lower: float | None = None
                                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """IS weights ``pi_old / pi_rollout``, 0 outside the mask: ``rho_t = exp(x_t)`` (``"token"``, Yao et al. 2025) or
    ``rho_i = exp(sum_t m_it x_it)`` on every token (``"sequence"``; Liu et al. 2025, richardli.xyz/rl-collapse,
    Sec. 4); then TIS ``min(rho, threshold)``, or with ``threshold_lower`` IcePop (arXiv:2510.18855): ``rho`` inside
    ``[threshold_lower, threshold]``, 0 outside. Metrics: ``rollout_corr/rollout_is_mean``,
    ``rollout_corr/rollout_is_ratio_fraction_high`` / ``_low`` (raw weight above ``threshold`` / below
    ``threshold_lower``, default ``1 / threshold``). ValueError for another level or bounds outside
    ``0 < threshold_lower <= threshold``."""
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is must be one of {ROLLOUT_IS_LEVELS}, got {rollout_is!r}")
    if threshold <= 0 or (threshold_lower is not None and not 0 < threshold_lower <= threshold):
        raise ValueError(f"need 0 < threshold_lower <= threshold, got {threshold_lower}, {threshold}")
    mask = response_mask.to(log_ratio.dtype)
    if rollout_is == "sequence":
        log_ratio = masked_sum(log_ratio, response_mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    raw = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)) * mask
    if threshold_lower is None:
        weights = raw.clamp(max=threshold)
    else:
        weights = torch.where((raw >= threshold_lower) & (raw <= threshold), raw, torch.zeros_like(raw))
    lower = 1.0 / threshold if threshold_lower is None else threshold_lower
    metrics = {
        "rollout_corr/rollout_is_mean": float(masked_mean(weights, response_mask)),
        "rollout_corr/rollout_is_ratio_fraction_high": float(masked_mean((raw > threshold).float(), response_mask)),
        "rollout_corr/rollout_is_ratio_fraction_low": float(masked_mean((raw < lower).float(), response_mask)),
    }
    return weights.detach(), metrics


def parse_rs_thresholds(options: list[str], spec: str | float) -> dict[str, tuple[float | None, float]]:
    """option -> ``(lower or None, upper)`` from ``rollout_rs_threshold``: one value for all or one per option
    (comma-separated); ``*k1`` takes ``"lower_upper"`` ratio bounds (``upper`` alone: ``[1/upper, upper]``), k2/k3
    one upper bound. ValueError for another count, a non-positive or unordered bound, or a pair on k2/k3."""
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(parts) == 1:
        parts = parts * len(options)
    if len(parts) != len(options):
        raise ValueError(f"rollout_rs_threshold {spec!r}: give 1 value or {len(options)} (one per rollout_rs option)")
    bounds: dict[str, tuple[float | None, float]] = {}
    for option, part in zip(options, parts):
        if option.endswith("k1"):
            lower_s, _, upper_s = part.rpartition("_") if "_" in part else ("", "", part)
            upper = float(upper_s)
            lower = float(lower_s) if lower_s else 1.0 / upper
        elif "_" in part:
            raise ValueError(f"rollout_rs_threshold {part!r} for {option}: a single upper bound, no '_'")
        else:
            lower, upper = None, float(part)
        if upper <= 0 or (lower is not None and not 0 < lower <= upper):
            raise ValueError(f"rollout_rs_threshold {part!r} for {option}: need 0 < lower <= upper")
        bounds[option] = (lower, upper)
    return bounds


@torch.no_grad()
def compute_rollout_rejection_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str,
                                   rollout_rs_threshold: str | float) -> tuple[torch.Tensor, dict[str, float]]:
    """Rejection sampling (Liu et al. 2025, richardli.xyz/rl-collapse, Sec. 4, masked IS): each comma-separated
    option ``<level>_<k>`` of :data:`ROLLOUT_RS_OPTIONS` compares Schulman's ``k1 = -x``, ``k2 = x^2 / 2`` or
    ``k3 = exp(x) - 1 - x`` per token or the sequence's sum / mean / max to its bounds (:func:`parse_rs_thresholds`;
    k1 within ``[log lower, log upper]``, k2/k3 ``<= upper``). Returns the mask with rejected tokens at 0 and
    ``rollout_corr/rollout_rs_masked_fraction``. ValueError for an unknown option or a bad threshold."""
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    unknown = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
    if unknown or not options:
        raise ValueError(f"rollout_rs options {unknown or rollout_rs!r} unknown; valid: {list(ROLLOUT_RS_OPTIONS)}")
    bounds = parse_rs_thresholds(options, rollout_rs_threshold)
    x = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    estimators = {"k1": -x, "k2": 0.5 * x.square(), "k3": torch.exp(x) - 1.0 - x}
    valid = response_mask.bool()
    keep = torch.ones_like(valid)
    for option in options:
        level, k = option.rsplit("_", 1)
        stat = estimators[k]
        if level == "seq_sum":
            stat = masked_sum(stat, valid, dim=-1).unsqueeze(-1)
        elif level == "seq_mean":
            stat = masked_mean(stat, valid, dim=-1).unsqueeze(-1)
        elif level == "seq_max":
            stat = torch.where(valid, stat, -torch.inf).amax(dim=-1, keepdim=True)
            stat = torch.where(stat == -torch.inf, torch.zeros_like(stat), stat)
        lower, upper = bounds[option]
        if k == "k1":
            passed = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            passed = stat <= upper
        keep = keep & passed.expand_as(valid)
    new_mask = response_mask * keep.to(response_mask.dtype)
    metrics = {"rollout_corr/rollout_rs_masked_fraction": float(masked_mean((~keep).float(), valid))}
    return new_mask, metrics


@torch.no_grad()
def correct_rollout(old_log_prob: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, *,
                    tis_cap: float | None = None, rollout_is: str | None = None, rollout_is_threshold: float = 2.0,
                    rollout_is_threshold_lower: float | None = None, rollout_rs: str | None = None,
                    rollout_rs_threshold: str | float | None = None
                    ) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """One micro-batch's correction: TIS when ``tis_cap`` is set, else ``rollout_is`` weights; then the
    ``rollout_rs`` mask. Returns ``(weights or None, mask, metrics)``."""
    weights, metrics, mask = None, {}, response_mask
    log_ratio = old_log_prob - rollout_log_probs
    if tis_cap is not None:
        weights, tis = compute_tis_weights(old_log_prob, rollout_log_probs, response_mask, tis_cap)
        metrics = {key: tis[key] for key in ("rollout/tis_weight_mean", "rollout/tis_clip_frac")}
    elif rollout_is is not None:
        weights, metrics = compute_rollout_correction_weights(log_ratio, response_mask, rollout_is,
                                                              rollout_is_threshold, rollout_is_threshold_lower)
    if rollout_rs is not None:
        mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    return weights, mask, metrics
