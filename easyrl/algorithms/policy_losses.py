"""Policy-gradient losses, registered by ``worker.actor.loss_type`` in :data:`POLICY_LOSSES`.

Every loss maps one micro-batch's :class:`PolicyLossInputs` and the actor's :class:`PolicyLossSettings` to a scalar
aggregated by :func:`~easyrl.algorithms.loss_agg.agg_loss` and a dict of metrics::

    pg_loss, metrics = POLICY_LOSSES.get(loss_type)(inputs, settings)

metrics (floats): ``pg_clipfrac`` (share of valid tokens where clipping changed the loss), ``pg_clipfrac_lower``
(where the dual clip engaged), ``ppo_kl`` (masked mean of old - new log-prob). docs/algorithms.md has every formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from easyrl.algorithms.loss_agg import agg_loss
from easyrl.algorithms.masked_ops import masked_mean
from easyrl.algorithms.registry import Registry

__all__ = ["LOG_RATIO_CLAMP", "LossOut", "POLICY_LOSSES", "PolicyLossInputs", "PolicyLossSettings", "clipped_surrogate",
           "finish_policy_loss", "importance_ratio", "sapo_gate"]

LOG_RATIO_CLAMP = 20.0  # |log pi/pi_old| above this is clamped before exp (exp(20) ~ 4.9e8)


@dataclass(frozen=True, eq=False)
class PolicyLossInputs:
    """One micro-batch's ``(bsz, resp_len)`` tensors for a policy loss: ``old_log_prob`` (the sampling policy's, no
    gradient), ``log_prob`` (the current policy's), ``advantages``, ``response_mask`` ``{0, 1}``, optional
    ``rollout_is_weights`` (multiplied into the per-token loss, detached); ``agg_kwargs`` go to ``agg_loss``."""

    old_log_prob: torch.Tensor
    log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    rollout_is_weights: torch.Tensor | None = None
    agg_kwargs: dict | None = None


@dataclass(frozen=True)
class PolicyLossSettings:
    """The ``worker.actor`` settings a policy loss reads, built by :meth:`of`; each is documented, with its default
    (the only one), on the config field of the same name (``easyrl.config.actor.ActorConfig``)."""

    loss_agg_mode: str
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_dual: float
    tau_positive: float
    tau_negative: float
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    dro_beta: float | None
    bypass_loss_type: str
    rollout_is: str | None
    rollout_is_threshold: float
    rollout_is_threshold_lower: float | None
    rollout_rs: str | None
    rollout_rs_threshold: str | float | None

    @classmethod
    def of(cls, config: Any) -> PolicyLossSettings:
        """The settings read from ``config`` (``worker.actor``, an ``ActorConfig``) by field name."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})


LossOut = tuple[torch.Tensor, dict[str, float]]  # (0-dim loss, metrics)
PolicyLoss = Callable[[PolicyLossInputs, PolicyLossSettings], LossOut]

POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", uses_engine_log_probs=False, needs_dro_beta=False,
                                                paper_check=None)
"""``worker.actor.loss_type`` -> ``fn(inputs, settings) -> (0-dim pg_loss, metrics)``. Traits: ``uses_engine_log_probs``
(the old policy is ``rollout_log_probs``), ``needs_dro_beta``, ``paper_check`` (``fn(name, settings) -> message or
None``: how the settings differ from the paper, a config warning)."""


def _gspo_paper(name: str, s: PolicyLossSettings) -> str | None:
    if s.loss_agg_mode == "seq-mean-token-mean" and max(s.clip_ratio_low, s.clip_ratio_high) <= 1e-2:
        return None
    return (f"worker.actor.loss_type={name} with loss_agg_mode={s.loss_agg_mode}, clip_ratio_low={s.clip_ratio_low}, "
            f"clip_ratio_high={s.clip_ratio_high}: the GSPO paper (arXiv:2507.18071) clips the sequence ratio "
            "to [1 - 3e-4, 1 + 4e-4] and averages over sequences (seq-mean-token-mean; verl <= 0.9.0 forced it); "
            "token-level ranges such as 0.2/0.28 almost never clip a length-normalised sequence ratio.")


def _cispo_paper(name: str, s: PolicyLossSettings) -> str | None:
    if s.clip_ratio_low >= 1.0 and s.loss_agg_mode == "token-mean":
        return None
    return (f"worker.actor.loss_type={name} with clip_ratio_low={s.clip_ratio_low}, loss_agg_mode={s.loss_agg_mode}: "
            "MiniMax-M1's CISPO (arXiv:2506.13585, Eq. 4-5) has no lower bound on the IS weight "
            "(set worker.actor.clip_ratio_low: 1.0) and normalises by the number of tokens (token-mean).")


def _sapo_paper(name: str, s: PolicyLossSettings) -> str | None:
    if s.loss_agg_mode == "seq-mean-token-mean":
        return None
    return (f"worker.actor.loss_type={name} with loss_agg_mode={s.loss_agg_mode}: the SAPO paper (arXiv:2511.20347) "
            "averages each sequence's token mean over the group (seq-mean-token-mean, which verl forces).")


def importance_ratio(inputs: PolicyLossInputs) -> torch.Tensor:
    """Importance ratio ``r = exp(clamp(logp - logp_old, -20, 20))``, ``(bsz, resp_len)``, differentiable in logp."""
    return torch.exp(torch.clamp(inputs.log_prob - inputs.old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def clipped_surrogate(advantages: torch.Tensor, ratio: torch.Tensor,
                      settings: PolicyLossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's ``max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))`` and where the clipped term is larger
    (bool), both ``(bsz, resp_len)``."""
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high)
    return torch.maximum(loss_unclipped, loss_clipped), loss_clipped > loss_unclipped


def finish_policy_loss(pg_losses: torch.Tensor, inputs: PolicyLossInputs, settings: PolicyLossSettings,
                       clipped: torch.Tensor | None = None, dual_clipped: torch.Tensor | None = None) -> LossOut:
    """Weight ``pg_losses`` ``(bsz, resp_len)`` by the detached IS weights, aggregate, and measure ``pg_clipfrac`` /
    ``pg_clipfrac_lower`` (masked means of the bool ``clipped`` / ``dual_clipped``, 0 when None) and ``ppo_kl``.
    ValueError for an unknown ``loss_agg_mode``."""
    mask = inputs.response_mask
    if inputs.rollout_is_weights is not None:
        pg_losses = pg_losses * inputs.rollout_is_weights.detach()
    pg_loss = agg_loss(pg_losses, mask, settings.loss_agg_mode, **(inputs.agg_kwargs or {}))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": 0.0 if clipped is None else float(masked_mean(clipped.float(), mask)),
            "pg_clipfrac_lower": 0.0 if dual_clipped is None else float(masked_mean(dual_clipped.float(), mask)),
            "ppo_kl": float(masked_mean(inputs.old_log_prob - inputs.log_prob, mask)),
        }
    return pg_loss, metrics


@POLICY_LOSSES.register("vanilla")
def vanilla_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, Eq. 7) with the decoupled range
    ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` (DAPO, arXiv:2503.14476, Sec. 3.1) and the dual clip (Ye et al.
    2020, arXiv:1912.09729, Eq. 5): ``l = max(-A r, -A clip(r))``, for ``A < 0`` at most ``-A c``
    (``c = clip_ratio_dual``). ValueError if ``c <= 1`` or the mode is unknown."""
    if settings.clip_ratio_dual <= 1.0:
        raise ValueError(f"clip_ratio_dual must be > 1 (dual-clip PPO), got {settings.clip_ratio_dual}")
    advantages = inputs.advantages
    clip_loss, clipped = clipped_surrogate(advantages, importance_ratio(inputs), settings)
    dual_bound = -advantages * settings.clip_ratio_dual
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(clip_loss, dual_bound), clip_loss)
    return finish_policy_loss(pg_losses, inputs, settings, clipped=clipped,
                              dual_clipped=negative & (clip_loss > dual_bound))


@POLICY_LOSSES.register("gspo", paper_check=_gspo_paper)
def gspo_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """GSPO-token (Zheng et al. 2025, arXiv:2507.18071): ``s_i = exp(mean_t(logp_it - logp_old_it))`` (log clamped
    to [-20, 20]), ``s_it = sg[s_i] * exp(logp_it - sg[logp_it])`` (value ``s_i``, gradient ``s_i grad logp_it``),
    ``l = max(-A s_it, -A clip(s_it, 1 - low, 1 + high))``; no dual clip."""
    log_prob = inputs.log_prob
    seq_log_ratio = masked_mean(log_prob - inputs.old_log_prob, inputs.response_mask, dim=-1).detach()  # (bsz,)
    seq_log_ratio = torch.clamp(seq_log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    token_ratio = torch.exp(seq_log_ratio.unsqueeze(-1) + log_prob - log_prob.detach())
    pg_losses, clipped = clipped_surrogate(inputs.advantages, token_ratio, settings)
    return finish_policy_loss(pg_losses, inputs, settings, clipped=clipped)


@POLICY_LOSSES.register("cispo", paper_check=_cispo_paper)
def cispo_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """CISPO (MiniMax-M1, arXiv:2506.13585, Eq. 4-5): ``l_t = -sg(clip(r_t, 1 - low, 1 + high)) * A_t * logp_t``, the
    IS weight clipped and detached but no token's gradient dropped; ``pg_clipfrac``: share of clipped weights."""
    ratio = importance_ratio(inputs).detach()
    weight = torch.clamp(ratio, 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high)
    pg_losses = -weight * inputs.advantages * inputs.log_prob
    return finish_policy_loss(pg_losses, inputs, settings, clipped=weight != ratio)


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """SAPO's soft gate ``f(r) = (4 / tau) * sigmoid(tau * (r - 1))`` (Gao et al. 2025, arXiv:2511.20347), shaped
    like ``ratio``; ``f'(1) = 1``, decaying smoothly off policy (``tau`` > 0, float or broadcastable tensor)."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@POLICY_LOSSES.register("sapo", paper_check=_sapo_paper)
def sapo_policy_loss(inputs: PolicyLossInputs, settings: PolicyLossSettings) -> LossOut:
    """SAPO (Gao et al. 2025, arXiv:2511.20347): ``l_t = -A_t * f(r_t; tau_t)`` with :func:`sapo_gate`,
    ``tau_t = tau_positive`` where ``A_t > 0`` else ``tau_negative``; no hard clip.
    ValueError for a non-positive temperature or an unknown mode."""
    tau_positive, tau_negative = settings.tau_positive, settings.tau_negative
    if not (tau_positive > 0 and tau_negative > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got tau_positive={tau_positive}, tau_negative={tau_negative}")
    advantages = inputs.advantages
    ratio = importance_ratio(inputs)
    tau = torch.where(advantages > 0, float(tau_positive), float(tau_negative)).to(ratio.dtype)
    pg_losses = -advantages * sapo_gate(ratio, tau)
    return finish_policy_loss(pg_losses, inputs, settings)


POLICY_LOSSES.register("gspo_token", paper_check=_gspo_paper)(gspo_policy_loss)
