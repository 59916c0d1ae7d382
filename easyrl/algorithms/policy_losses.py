"""Policy-gradient losses, registered by ``worker.actor.loss_type`` in :data:`POLICY_LOSSES`.

Every loss maps one micro-batch's :class:`PolicyLossInputs` and the actor's :class:`PolicyLossSettings` to a scalar
aggregated by :func:`~easyrl.algorithms.loss_agg.agg_loss` and a dict of metrics::

    pg_loss, metrics = POLICY_LOSSES.get(loss_type)(inputs, settings)

metrics (floats): ``pg_clipfrac`` (fraction of valid tokens where clipping changed the loss), ``pg_clipfrac_lower``
(fraction where the dual clip engaged; 0 for losses without one), ``ppo_kl`` (masked mean of old - new log-prob).
A loss reads only the settings it uses, so the actor calls every loss the same way. docs/algorithms.md gives every
formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from easyrl.algorithms.loss_agg import agg_loss
from easyrl.algorithms.masked_ops import masked_mean
from easyrl.algorithms.registry import Registry

__all__ = ["LOG_RATIO_CLAMP", "POLICY_LOSSES", "PolicyLossInputs", "PolicyLossSettings", "finish_policy_loss",
           "importance_ratio", "sapo_gate"]

LOG_RATIO_CLAMP = 20.0  # |log pi/pi_old| above this is clamped before exp (exp(20) ~ 4.9e8)


@dataclass(frozen=True, eq=False)
class PolicyLossInputs:
    """One micro-batch's tensors for a policy loss.

    Attributes:
        old_log_prob: ``(bsz, resp_len)`` log-probs of the policy that sampled the data (no gradient).
        log_prob: ``(bsz, resp_len)`` log-probs of the current policy (gradient flows here).
        advantages: ``(bsz, resp_len)``.
        response_mask: ``(bsz, resp_len)`` ``{0, 1}``.
        rollout_is_weights: optional ``(bsz, resp_len)`` truncated-IS weights (see
            :func:`~easyrl.algorithms.rollout_correction.compute_tis_weights`), multiplied into the per-token loss
            (detached).
        agg_kwargs: keyword arguments for :func:`~easyrl.algorithms.loss_agg.agg_loss` (``global_num_tokens``,
            ``global_num_seqs``, ``dp_size``, ``norm_length``), or None.
    """

    old_log_prob: torch.Tensor
    log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    rollout_is_weights: torch.Tensor | None = None
    agg_kwargs: dict | None = None


@dataclass(frozen=True)
class PolicyLossSettings:
    """The ``worker.actor`` settings a policy loss reads (the actor copies them from its config).

    Attributes:
        loss_agg_mode: see :func:`~easyrl.algorithms.loss_agg.agg_loss`.
        clip_ratio_low, clip_ratio_high: clip range ``[1 - low, 1 + high]`` (``vanilla``, ``gspo``; ``cispo``'s IS
            weight bounds).
        clip_ratio_dual: dual-clip constant ``c`` > 1 (``vanilla``).
        tau_positive, tau_negative: SAPO's gate temperatures > 0 (``sapo``).
        clip_cov_ratio, clip_cov_lb, clip_cov_ub: fraction of tokens clip-cov detaches and the covariance band they are
            drawn from (``clip_cov``).
        kl_cov_ratio, ppo_kl_coef: fraction of tokens KL-cov penalises and the weight of ``|log r|`` (``kl_cov``).
        dro_beta: DRO's quadratic log-ratio penalty > 0 (``dro``).
        bypass_loss_type: ``"ppo_clip"`` or ``"reinforce"`` (``bypass_mode``).
        rollout_is, rollout_is_threshold, rollout_is_threshold_lower, rollout_rs, rollout_rs_threshold: the rollout
            correction ``bypass_mode`` computes itself (see
            :func:`~easyrl.algorithms.rollout_correction.compute_rollout_correction_weights` and
            :func:`~easyrl.algorithms.rollout_correction.compute_rollout_rejection_mask`).
    """

    loss_agg_mode: str
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_dual: float
    tau_positive: float = 1.0
    tau_negative: float = 1.05
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4
    ppo_kl_coef: float = 0.1
    dro_beta: float | None = None
    bypass_loss_type: str = "ppo_clip"
    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0
    rollout_is_threshold_lower: float | None = None
    rollout_rs: str | None = None
    rollout_rs_threshold: str | float | None = None

    @classmethod
    def of(cls, config: Any) -> PolicyLossSettings:
        """The settings read from ``config`` (``worker.actor``: an object with an attribute of each field's name)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})


PolicyLoss = Callable[[PolicyLossInputs, PolicyLossSettings], tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", uses_engine_log_probs=False, needs_dro_beta=False,
                                                paper_check=None)
"""``worker.actor.loss_type`` -> loss ``fn(inputs, settings) -> (pg_loss 0-dim tensor, metrics dict of floats)``.
Traits: ``uses_engine_log_probs``: the old policy is the rollout engine's log-probs (``rollout_log_probs``);
``needs_dro_beta``: reads ``settings.dro_beta``; ``paper_check``: ``fn(name, settings) -> message or None``, how the
settings differ from the loss's paper (a config warning, ``easyrl.config.traps``)."""


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


def finish_policy_loss(
    pg_losses: torch.Tensor,
    inputs: PolicyLossInputs,
    settings: PolicyLossSettings,
    clipped: torch.Tensor | None = None,
    dual_clipped: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Apply the (detached) truncated-IS weights to the per-token losses ``(bsz, resp_len)``, aggregate them, and
    compute the metrics: ``pg_clipfrac`` / ``pg_clipfrac_lower`` are the masked means of the bool ``(bsz, resp_len)``
    ``clipped`` / ``dual_clipped`` (0 when None), ``ppo_kl`` the masked mean of ``old_log_prob - log_prob``.

    Raises:
        ValueError: if ``settings.loss_agg_mode`` is unknown.
    """
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
def vanilla_policy_loss(
    inputs: PolicyLossInputs, settings: PolicyLossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, Eq. 7) with decoupled clip range
    ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` (DAPO "clip-higher", Yu et al. 2025, arXiv:2503.14476, Sec. 3.1)
    and dual clip for negative advantages (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep
    Reinforcement Learning", arXiv:1912.09729, Eq. 5).

    With ``r = exp(clamp(logp - logp_old, -20, 20))`` and ``c = clip_ratio_dual``, per token:

    * ``A >= 0``: ``l = max(-A r, -A clip(r))``;
    * ``A < 0``:  ``l = min(max(-A r, -A clip(r)), -A c)`` (bounds the loss when ``r`` explodes).

    Raises:
        ValueError: if ``clip_ratio_dual <= 1`` or the mode is unknown.
    """
    if settings.clip_ratio_dual <= 1.0:
        raise ValueError(f"clip_ratio_dual must be > 1 (dual-clip PPO), got {settings.clip_ratio_dual}")
    advantages = inputs.advantages
    ratio = importance_ratio(inputs)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    dual_bound = -advantages * settings.clip_ratio_dual
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(clip_loss, dual_bound), clip_loss)
    return finish_policy_loss(pg_losses, inputs, settings, clipped=loss_clipped > loss_unclipped,
                   dual_clipped=negative & (clip_loss > dual_bound))


@POLICY_LOSSES.register("gspo", paper_check=_gspo_paper)
def gspo_policy_loss(
    inputs: PolicyLossInputs, settings: PolicyLossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group Sequence Policy Optimization, token form "GSPO-token" (Zheng et al. 2025, arXiv:2507.18071).

    Sequence ratio ``s_i = exp(mean_t(logp_it - logp_old_it))`` (the length-normalised sequence likelihood
    ratio), token ratio ``s_it = sg[s_i] * exp(logp_it - sg[logp_it])``: its value is ``s_i`` on every token of
    sequence ``i`` (so clipping is decided per sequence) while its gradient is ``s_i * grad logp_it``, which
    lets token-level advantages flow. Per token ``l = max(-A s_it, -A clip(s_it, 1 - low, 1 + high))``. With
    one advantage per sequence this equals GSPO's sequence objective. The paper averages over sequences
    (``loss_agg_mode="seq-mean-token-mean"``) with ranges 3e-4 / 4e-4; the configured mode is honoured. ``log s_i``
    (detached) is clamped to [-20, 20], so the gradient always flows. No dual clip: ``pg_clipfrac_lower`` is 0.
    """
    log_prob, advantages = inputs.log_prob, inputs.advantages
    seq_log_ratio = masked_mean(log_prob - inputs.old_log_prob, inputs.response_mask, dim=-1).detach()  # (bsz,)
    seq_log_ratio = torch.clamp(seq_log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    token_ratio = torch.exp(seq_log_ratio.unsqueeze(-1) + log_prob - log_prob.detach())
    loss_unclipped = -advantages * token_ratio
    loss_clipped = -advantages * torch.clamp(
        token_ratio, 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high
    )
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    return finish_policy_loss(pg_losses, inputs, settings, clipped=loss_clipped > loss_unclipped)


@POLICY_LOSSES.register("cispo", paper_check=_cispo_paper)
def cispo_policy_loss(
    inputs: PolicyLossInputs, settings: PolicyLossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO, clipped IS-weight policy optimisation (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute
    Efficiently with Lightning Attention", arXiv:2506.13585, Eq. 4-5).

    ``l_t = -sg(clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A_t * logp_t`` with
    ``r_t = exp(clamp(logp_t - logp_old_t, -20, 20))``: the IS weight is clipped and detached, but no token's
    gradient is ever dropped (unlike PPO clipping). The paper's ``eps_low^IS`` / ``eps_high^IS`` are
    ``clip_ratio_low`` / ``clip_ratio_high``; it disables the lower bound (here ``clip_ratio_low >= 1``) and uses
    ``loss_agg_mode="token-mean"``. ``pg_clipfrac``: the fraction of valid tokens whose IS weight was clipped.
    """
    ratio = importance_ratio(inputs).detach()
    weight = torch.clamp(ratio, 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high)
    pg_losses = -weight * inputs.advantages * inputs.log_prob
    return finish_policy_loss(pg_losses, inputs, settings, clipped=weight != ratio)


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """SAPO's soft gate ``f(r) = (4 / tau) * sigmoid(tau * (r - 1))`` (Gao et al. 2025, arXiv:2511.20347).

    ``f(1) = 2 / tau`` and ``f'(r) = 4 sigmoid(x) (1 - sigmoid(x))`` with ``x = tau (r - 1)``, so ``f'(1) = 1``: on
    policy the gradient equals the plain policy gradient; away from ``r = 1`` it decays smoothly (faster for a
    larger ``tau``) instead of dropping to 0 at a hard clip boundary.

    Args:
        ratio: importance ratio ``r``, any shape.
        tau: temperature > 0, a float or a tensor broadcastable to ``ratio``.

    Returns:
        Tensor shaped like ``ratio``.
    """
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@POLICY_LOSSES.register("sapo", paper_check=_sapo_paper)
def sapo_policy_loss(
    inputs: PolicyLossInputs, settings: PolicyLossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """Soft Adaptive Policy Optimization (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347,
    the SAPO objective and its gate ``f``).

    Per token ``l_t = -A_t * f(r_t; tau_t)`` with ``r_t = exp(clamp(logp_t - logp_old_t, -20, 20))``, the soft gate
    :func:`sapo_gate`, and ``tau_t = tau_positive`` where ``A_t > 0``, ``tau_negative`` otherwise (negative
    advantages get the larger temperature: their gradient decays faster off-policy, which the paper finds
    stabilises training). No hard clipping: ``clip_ratio_*`` are unused and the clip fractions are 0. The paper uses
    ``loss_agg_mode="seq-mean-token-mean"``; the configured mode is honoured (a config warning when it differs).

    Raises:
        ValueError: if a temperature is not positive, or the mode is unknown.
    """
    tau_positive, tau_negative = settings.tau_positive, settings.tau_negative
    if not (tau_positive > 0 and tau_negative > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got tau_positive={tau_positive}, tau_negative={tau_negative}")
    advantages = inputs.advantages
    ratio = importance_ratio(inputs)
    tau = torch.where(advantages > 0, float(tau_positive), float(tau_negative)).to(ratio.dtype)
    pg_losses = -advantages * sapo_gate(ratio, tau)
    return finish_policy_loss(pg_losses, inputs, settings)


# EasyR1's name for the token form of GSPO (docs/algorithms.md)
POLICY_LOSSES.register("gspo_token", paper_check=_gspo_paper)(gspo_policy_loss)
