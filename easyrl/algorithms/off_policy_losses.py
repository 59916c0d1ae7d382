"""Policy losses beyond PPO's ratio clip (``worker.actor.loss_type``): ``gpg``, ``dro``, ``geo_mean``, ``dppo_tv`` /
``dppo_kl`` and ``bypass_mode``, with the contract of :mod:`~easyrl.algorithms.policy_losses`."""

from __future__ import annotations

import dataclasses

import torch

from easyrl.algorithms.loss_agg import agg_loss
from easyrl.algorithms.masked_ops import masked_mean, masked_sum
from easyrl.algorithms.policy_losses import (
    POLICY_LOSSES,
    LossOut,
    PolicyLossInputs,
    PolicyLossSettings,
    finish_policy_loss,
    importance_ratio,
    vanilla_policy_loss,
)
from easyrl.algorithms.rollout_correction import correct_rollout

__all__ = ["bypass_mode_policy_loss", "dppo_kl_policy_loss", "dppo_tv_policy_loss", "dro_policy_loss",
           "geo_mean_policy_loss", "gpg_policy_loss"]


@POLICY_LOSSES.register("gpg")
def gpg_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """GPG (Chu et al. 2025, arXiv:2504.02546): REINFORCE, ``l_t = -A_t * logp_t``, no ratio, no clip."""
    return finish_policy_loss(-inputs.advantages * inputs.log_prob, inputs, settings)


@POLICY_LOSSES.register("dro", needs_dro_beta=True)
def dro_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """DRO's policy term (Richemond et al. 2024, arXiv:2405.19107): ``l_t = -(A_t * logp_t - dro_beta / 2 * (logp_t -
    logp_old_t)^2)``. ValueError unless ``dro_beta > 0``."""
    if settings.dro_beta is None or settings.dro_beta <= 0:
        raise ValueError(f"loss_type dro needs worker.actor.dro_beta > 0, got {settings.dro_beta}")
    log_ratio = inputs.log_prob - inputs.old_log_prob
    pg_losses = -(inputs.advantages * inputs.log_prob - 0.5 * settings.dro_beta * log_ratio.square())
    return finish_policy_loss(pg_losses, inputs, settings)


@POLICY_LOSSES.register("geo_mean")
def geo_mean_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """GMPO (Zhao et al. 2025, arXiv:2507.20673): with ``d_t = logp_t - logp_old_t``, ``s = sign(A_t)`` and
    ``c_t = s * min(s d_t, s clip(d_t, -clip_ratio_low, clip_ratio_high))``, per sequence
    ``l_i = -mean_t(A_it) * exp(mean_t(c_it))`` (times ``exp(mean_t log(w_it + 1e-10))`` with IS weights), averaged
    over the sequences with a valid token (global count and ``dp_size`` of ``agg_kwargs``; ``loss_agg_mode`` unused).
    ``pg_clipfrac`` / ``pg_clipfrac_lower``: share of valid tokens clipped with a positive / negative advantage."""
    mask = inputs.response_mask
    advantages, log_ratio = inputs.advantages, inputs.log_prob - inputs.old_log_prob
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -settings.clip_ratio_low, settings.clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = mask.sum(dim=-1).clamp(min=1).to(log_ratio.dtype)
    seq_ratio = torch.exp(masked_sum(pessimistic, mask, dim=-1) / lengths)
    seq_loss = -(masked_sum(advantages, mask, dim=-1) / lengths) * seq_ratio
    if inputs.rollout_is_weights is not None:
        log_w = torch.log(inputs.rollout_is_weights.detach() + 1e-10)
        seq_loss = seq_loss * torch.exp(masked_sum(log_w, mask, dim=-1) / lengths)
    seq_valid = mask.bool().any(dim=-1)
    kwargs = inputs.agg_kwargs or {}
    count = kwargs.get("global_num_seqs") or int(seq_valid.sum())
    pg_loss = masked_sum(seq_loss, seq_valid) / max(int(count), 1) * kwargs.get("dp_size", 1)
    clipped = log_ratio != clamped
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": float(masked_mean((clipped & (advantages > 0)).float(), mask)),
            "pg_clipfrac_lower": float(masked_mean((clipped & (advantages < 0)).float(), mask)),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
        }
    return pg_loss, metrics


def _dppo_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings, inside: torch.Tensor):
    """``l_t = -A_t * sg[min(r_t, c)] * logp_t`` on the tokens ``inside`` the trust region (``c = clip_ratio_dual``);
    ``pg_clipfrac``: share outside, ``pg_clipfrac_lower``: inside with ``r > c``."""
    ratio = importance_ratio(inputs)
    inside = inside.detach()
    truncated = torch.clamp(ratio, max=settings.clip_ratio_dual).detach()
    pg_losses = -inputs.advantages * truncated * inputs.log_prob * inside.to(ratio.dtype)
    return finish_policy_loss(pg_losses, inputs, settings, clipped=~inside,
                              dual_clipped=inside & (ratio > settings.clip_ratio_dual))


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """DPPO-Binary-TV (arXiv:2602.04879): a token is trained while ``p_t - p_old_t <= clip_ratio_high`` (``A_t > 0``)
    or ``>= -clip_ratio_low`` (else); the thresholds are probability differences here."""
    delta = torch.exp(inputs.log_prob) - torch.exp(inputs.old_log_prob)
    inside = torch.where(inputs.advantages > 0, delta <= settings.clip_ratio_high, delta >= -settings.clip_ratio_low)
    return _dppo_loss(inputs, settings, inside)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """DPPO-Binary-KL (arXiv:2602.04879): as ``dppo_tv`` with the binary KL ``D_t = p_old log(p_old / p) + (1 - p_old)
    log((1 - p_old + 1e-8) / (1 - p + 1e-8))``; inside while ``D_t <= clip_ratio_high`` or ``p_t <= p_old_t``
    (``A_t > 0``), else ``D_t <= clip_ratio_low`` or ``p_t >= p_old_t``."""
    log_prob, old_log_prob = inputs.log_prob, inputs.old_log_prob
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
    inside = torch.where(inputs.advantages > 0, (binary_kl <= settings.clip_ratio_high) | (prob <= old_prob),
                         (binary_kl <= settings.clip_ratio_low) | (prob >= old_prob))
    return _dppo_loss(inputs, settings, inside)


@POLICY_LOSSES.register("bypass_mode", uses_engine_log_probs=True)
def bypass_mode_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """Bypass mode (Yao et al. 2025, fengyao.notion.site/off-policy-rl; Liu et al. 2025, richardli.xyz/rl-collapse):
    ``inputs.old_log_prob`` holds the rollout engine's log-probs (the trainer's old-log-prob pass is skipped with
    ``algorithm.bypass_mode``; without it the pass still runs, for the ``rollout/*`` metrics and the weight-sync
    check, unless the update is on-policy). The IS weights ``w`` (``rollout_is*``) and rejection mask
    (``rollout_rs*``) are computed here from ``logp - logp_rollout``; ``ppo_clip``: ``vanilla`` on the kept tokens
    (no ``w``); ``reinforce``: ``l_t = -A_t * logp_t * w_t``. ``inputs.rollout_is_weights`` is ignored; metrics
    add ``rollout_corr/*``. ValueError for another ``bypass_loss_type`` or from the corrections."""
    if settings.bypass_loss_type not in ("ppo_clip", "reinforce"):
        raise ValueError(f"bypass_loss_type must be ppo_clip or reinforce, got {settings.bypass_loss_type!r}")
    weights, mask, extra = correct_rollout(
        inputs.log_prob.detach(), inputs.old_log_prob, inputs.response_mask, rollout_is=settings.rollout_is,
        rollout_is_threshold=settings.rollout_is_threshold,
        rollout_is_threshold_lower=settings.rollout_is_threshold_lower, rollout_rs=settings.rollout_rs,
        rollout_rs_threshold=settings.rollout_rs_threshold)
    if settings.bypass_loss_type == "ppo_clip":
        pg_loss, metrics = vanilla_policy_loss(
            dataclasses.replace(inputs, response_mask=mask, rollout_is_weights=None), settings)
    else:
        pg_losses = -inputs.advantages * inputs.log_prob * (1.0 if weights is None else weights)
        pg_loss = agg_loss(pg_losses, mask, settings.loss_agg_mode, **(inputs.agg_kwargs or {}))
        metrics = {"pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0,
                   "ppo_kl": float(masked_mean(inputs.old_log_prob - inputs.log_prob.detach(), mask))}
    return pg_loss, {**metrics, **extra}

