"""Clip-Cov and KL-Cov policy losses (Cui et al. 2025, arXiv:2505.22617, Sec. 4): entropy-collapse control acting
only on the tokens of highest covariance ``cov_t = (A_t - mean(A)) * (logp_t - mean(sg[logp]))`` over the valid
tokens of the micro-batch."""

from __future__ import annotations

import torch

from easyrl.algorithms.masked_ops import masked_mean
from easyrl.algorithms.policy_losses import (
    POLICY_LOSSES,
    LossOut,
    PolicyLossInputs,
    PolicyLossSettings,
    clipped_surrogate,
    finish_policy_loss,
)

__all__ = ["clip_cov_policy_loss", "kl_cov_policy_loss"]


@POLICY_LOSSES.register("clip_cov")
def clip_cov_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """Clip-Cov: PPO's clipped surrogate ``max(-A r, -A clip(r, 1 - low, 1 + high))`` (``r`` not clamped, no dual
    clip), with loss 0 on ``max(1, int(clip_cov_ratio * T))`` tokens drawn by ``torch.randperm`` among the unclipped
    valid ones with ``clip_cov_lb < cov < clip_cov_ub``; ``pg_clipfrac`` is their fraction.
    ValueError if ``clip_cov_ratio <= 0`` or the mode is unknown."""
    if settings.clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {settings.clip_cov_ratio}")
    advantages, log_prob, mask = inputs.advantages, inputs.log_prob, inputs.response_mask
    valid = mask.bool()
    pg_losses, clipped = clipped_surrogate(advantages, torch.exp(log_prob - inputs.old_log_prob), settings)
    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))
        in_band = (cov > settings.clip_cov_lb) & (cov < settings.clip_cov_ub)
        eligible = valid & ~clipped & in_band
        candidates = torch.nonzero(eligible)  # (n, 2), row-major
        n_detach = max(int(settings.clip_cov_ratio * int(valid.sum())), 1)
        keep = torch.ones_like(advantages)
        if len(candidates) > 0:
            chosen = candidates[torch.randperm(len(candidates))[:n_detach]]
            keep[chosen[:, 0], chosen[:, 1]] = 0
    return finish_policy_loss(pg_losses * keep, inputs, settings, clipped=keep == 0)


@POLICY_LOSSES.register("kl_cov")
def kl_cov_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """KL-Cov: the unclipped ``-A r`` plus ``ppo_kl_coef * |logp - logp_old|`` on the
    ``max(1, int(kl_cov_ratio * T))`` valid tokens of largest covariance; clip fractions 0, ``ppo_kl`` the masked
    mean of ``|logp - logp_old|``. ValueError if ``kl_cov_ratio <= 0`` or the mode is unknown."""
    if settings.kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {settings.kl_cov_ratio}")
    advantages, log_prob, mask = inputs.advantages, inputs.log_prob, inputs.response_mask
    log_ratio = log_prob - inputs.old_log_prob
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    valid_flat = torch.nonzero(mask.bool().reshape(-1), as_tuple=True)[0]
    if len(valid_flat) > 0:
        with torch.no_grad():
            adv = advantages.reshape(-1)[valid_flat]
            logp = log_prob.detach().reshape(-1)[valid_flat]
            cov = (adv - adv.mean()) * (logp - logp.mean())
            top = valid_flat[torch.topk(cov, max(1, int(len(cov) * settings.kl_cov_ratio))).indices]
        penalised = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
        penalised[top] = True
        penalised = penalised.view_as(mask)
        pg_losses = torch.where(penalised, pg_losses + settings.ppo_kl_coef * log_ratio.abs(), pg_losses)
    pg_loss, metrics = finish_policy_loss(pg_losses, inputs, settings)
    metrics["ppo_kl"] = float(masked_mean(log_ratio.detach().abs(), mask))
    return pg_loss, metrics
