"""Policy losses beyond PPO's ratio clip, registered by ``worker.actor.loss_type`` (verl 0.9.1's names and semantics,
checked against verl in ``tests/test_verl_parity.py``): ``gpg``, ``dro``, ``geo_mean`` (GMPO), ``dppo_tv`` /
``dppo_kl`` (divergence trust regions) and ``bypass_mode`` (the rollout engine's log-probs as the old policy).

Each is a pure function ``fn(PolicyLossInputs, PolicyLossSettings) -> (pg_loss, metrics)`` like those of
:mod:`~easyrl.algorithms.policy_losses`; truncated-IS weights in the inputs multiply the per-token loss.
"""

from __future__ import annotations

import dataclasses

import torch

from easyrl.algorithms.loss_agg import agg_loss
from easyrl.algorithms.masked_ops import masked_mean, masked_sum
from easyrl.algorithms.policy_losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossSettings,
    finish_policy_loss,
    importance_ratio,
    vanilla_policy_loss,
)
from easyrl.algorithms.rollout_correction import compute_rollout_correction_weights, compute_rollout_rejection_mask

__all__ = ["bypass_mode_policy_loss", "dppo_kl_policy_loss", "dppo_tv_policy_loss", "dro_policy_loss",
           "geo_mean_policy_loss", "gpg_policy_loss"]


@POLICY_LOSSES.register("gpg")
def gpg_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG, Group Policy Gradient (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for
    Model Reasoning", arXiv:2504.02546, the GPG objective): plain REINFORCE, ``l_t = -A_t * logp_t``, no ratio and
    no clip (pair it with ``algorithm.adv_estimator: gpg``). Clip fractions are 0."""
    return finish_policy_loss(-inputs.advantages * inputs.log_prob, inputs, settings)


@POLICY_LOSSES.register("dro", needs_dro_beta=True)
def dro_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Reward Optimization's policy term (Richemond et al. 2024, "Offline Regularised Reinforcement Learning
    for Large Language Models Alignment", arXiv:2405.19107, the DRO policy loss, as verl 0.9.1's ``dro``): REINFORCE
    with a quadratic penalty on the log-ratio to the old policy,

    ``l_t = -(A_t * logp_t - beta / 2 * (logp_t - logp_old_t)^2)``, ``beta = dro_beta``.

    Raises ValueError if ``dro_beta`` is None or <= 0."""
    if settings.dro_beta is None or settings.dro_beta <= 0:
        raise ValueError(f"loss_type dro needs worker.actor.dro_beta > 0, got {settings.dro_beta}")
    log_ratio = inputs.log_prob - inputs.old_log_prob
    pg_losses = -(inputs.advantages * inputs.log_prob - 0.5 * settings.dro_beta * log_ratio.square())
    return finish_policy_loss(pg_losses, inputs, settings)


@POLICY_LOSSES.register("geo_mean")
def geo_mean_policy_loss(
    inputs: PolicyLossInputs, settings: PolicyLossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, "Geometric-Mean Policy Optimization",
    arXiv:2507.20673, the GMPO objective): the sequence's ratio is the geometric mean of its clipped token ratios,
    which bounds the influence of outlier tokens.

    With ``d_t = logp_t - logp_old_t`` (not clamped, as in verl), ``s = sign(A_t)`` and
    ``c_t = s * min(s d_t, s clip(d_t, -clip_ratio_low, clip_ratio_high))`` (clipping in log space, pessimistic in
    the sign of the advantage), per sequence ``i``:

    ``l_i = -mean_t(A_it) * exp(mean_t(c_it))``; with IS weights ``w`` also times ``exp(mean_t log(w_it + 1e-10))``.

    The sequence losses are averaged over the sequences with a valid token, with the global sequence count and
    ``dp_size`` of ``inputs.agg_kwargs`` (``loss_agg_mode`` is not used). verl 0.9.1 takes the plain mean over the
    micro-batch's rows (empty rows count, global normalisation does not apply); the two agree on a micro-batch
    without empty rows and with ``dp_size`` 1.

    Metrics: ``pg_clipfrac`` / ``pg_clipfrac_lower``: fraction of valid tokens whose ``d_t`` was clipped with a
    positive / negative advantage; ``ppo_kl``.
    """
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
    """DPPO's common end: ``l_t = -A_t * sg[min(r_t, c)] * logp_t`` on the tokens ``inside`` the trust region, 0
    elsewhere (``c = clip_ratio_dual``); ``pg_clipfrac`` = fraction outside, ``pg_clipfrac_lower`` = fraction inside
    with ``r > c``."""
    ratio = importance_ratio(inputs)
    inside = inside.detach()
    truncated = torch.clamp(ratio, max=settings.clip_ratio_dual).detach()
    pg_losses = -inputs.advantages * truncated * inputs.log_prob * inside.to(ratio.dtype)
    return finish_policy_loss(pg_losses, inputs, settings, clipped=~inside,
                              dual_clipped=inside & (ratio > settings.clip_ratio_dual))


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv_policy_loss(
    inputs: PolicyLossInputs, settings: PolicyLossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-TV (divergence-based PPO, arXiv:2602.04879 as cited by verl 0.9.1: the binary total-variation trust
    region): a token
    is trained only while its probability moved less than the thresholds in the direction its advantage pushes it,

    ``inside_t = (p_t - p_old_t <= clip_ratio_high)`` if ``A_t > 0`` else ``(p_t - p_old_t >= -clip_ratio_low)``,
    ``l_t = -A_t * sg[min(r_t, c)] * logp_t * inside_t`` with ``r_t = exp(clamp(logp_t - logp_old_t, -20, 20))`` and
    the truncation ``c = clip_ratio_dual`` (verl reads its ``clip_ratio_c``, 3 by default; the paper, Sec. 5.4,
    recommends a large one).

    ``clip_ratio_low`` / ``clip_ratio_high`` are probability differences here, not ratio ranges. Metrics:
    ``pg_clipfrac`` = fraction of valid tokens outside the region, ``pg_clipfrac_lower`` = inside with ``r > c``."""
    delta = torch.exp(inputs.log_prob) - torch.exp(inputs.old_log_prob)
    inside = torch.where(inputs.advantages > 0, delta <= settings.clip_ratio_high, delta >= -settings.clip_ratio_low)
    return _dppo_loss(inputs, settings, inside)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl_policy_loss(
    inputs: PolicyLossInputs, settings: PolicyLossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-KL (arXiv:2602.04879, the binary-KL trust region): as :func:`dppo_tv_policy_loss` with the
    KL between the Bernoulli distributions "this token / any other" under the old and the new policy,

    ``D_t = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))``,

    and ``inside_t = (D_t <= clip_ratio_high) or (p_t <= p_old_t)`` if ``A_t > 0``, else
    ``(D_t <= clip_ratio_low) or (p_t >= p_old_t)`` (a token moving against its advantage's push is never masked)."""
    log_prob, old_log_prob = inputs.log_prob, inputs.old_log_prob
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
    inside = torch.where(inputs.advantages > 0, (binary_kl <= settings.clip_ratio_high) | (prob <= old_prob),
                         (binary_kl <= settings.clip_ratio_low) | (prob >= old_prob))
    return _dppo_loss(inputs, settings, inside)


@POLICY_LOSSES.register("bypass_mode", uses_engine_log_probs=True)
def bypass_mode_policy_loss(
    inputs: PolicyLossInputs, settings: PolicyLossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bypass mode (verl 0.9.1's ``bypass_mode``; the rollout-correction theory of Yao et al. 2025,
    https://fengyao.notion.site/off-policy-rl, and Liu et al. 2025, https://richardli.xyz/rl-collapse): the rollout
    engine's log-probs stand for the old policy, so the trainer's old-log-prob forward is skipped.
    ``inputs.old_log_prob`` must hold ``rollout_log_probs`` (the actor passes them).

    The IS weights ``w`` of the current policy against the rollout engine (``rollout_is``, ``rollout_is_threshold``,
    ``rollout_is_threshold_lower``: token/sequence TIS or IcePop) and the rejection mask (``rollout_rs``,
    ``rollout_rs_threshold``) are computed here (detached) from ``logp - logp_rollout``; then

    * ``bypass_loss_type="ppo_clip"``: :func:`~easyrl.algorithms.policy_losses.vanilla_policy_loss` with
      ``r = pi / pi_rollout`` on the kept tokens; ``w`` is not applied (the ratio already is the IS correction);
    * ``bypass_loss_type="reinforce"``: ``l_t = -A_t * logp_t * w_t`` on the kept tokens (REINFORCE with IS).

    ``inputs.rollout_is_weights`` is ignored. Metrics: the loss's own plus ``rollout_corr/*``.

    Raises:
        ValueError: for another ``bypass_loss_type``, or what the corrections raise.
    """
    if settings.bypass_loss_type not in ("ppo_clip", "reinforce"):
        raise ValueError(f"bypass_loss_type must be ppo_clip or reinforce, got {settings.bypass_loss_type!r}")
    log_ratio = (inputs.log_prob - inputs.old_log_prob).detach()
    mask, weights, extra = inputs.response_mask, None, {}
    if settings.rollout_is is not None:
        weights, extra = compute_rollout_correction_weights(
            log_ratio, mask, settings.rollout_is, settings.rollout_is_threshold, settings.rollout_is_threshold_lower)
    if settings.rollout_rs is not None:
        mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, mask, settings.rollout_rs,
                                                          settings.rollout_rs_threshold)
        extra.update(rs_metrics)
    if settings.bypass_loss_type == "ppo_clip":
        pg_loss, metrics = vanilla_policy_loss(
            dataclasses.replace(inputs, response_mask=mask, rollout_is_weights=None), settings)
    else:
        pg_losses = -inputs.advantages * inputs.log_prob * (1.0 if weights is None else weights)
        pg_loss = agg_loss(pg_losses, mask, settings.loss_agg_mode, **(inputs.agg_kwargs or {}))
        metrics = {"pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0,
                   "ppo_kl": float(masked_mean(-log_ratio, mask))}
    return pg_loss, {**metrics, **extra}

