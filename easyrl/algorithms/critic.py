"""PPO with a learned critic: GAE advantages (estimator ``"gae"``) and the clipped value loss. ``values[:, t]`` is
``V(s_t)``, the return estimated before response token ``t``, read where the actor reads token ``t``'s log-prob."""

from __future__ import annotations

import torch

from easyrl.algorithms.advantages import ADV_ESTIMATORS, AdvantageInputs
from easyrl.algorithms.loss_agg import agg_loss
from easyrl.algorithms.masked_ops import masked_mean, masked_whiten

__all__ = ["gae_advantage", "compute_value_loss"]


@ADV_ESTIMATORS.register("gae", needs_critic=True)
@torch.no_grad()
def gae_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016, arXiv:1506.02438, Eq. 16; PPO, arXiv:1707.06347, Eq. 11-12), right to left over
    valid tokens with ``V = 0`` after the last: ``delta_t = r_t + gamma V_{t+1} - V_t``,
    ``A_t = delta_t + gamma lam A_{t+1}``, returns ``R_t = A_t + V_t``; then ``A`` is whitened over the batch's valid
    tokens. A masked position passes the next valid ``V`` and ``A`` through unchanged.
    ValueError without ``values`` or with fewer than 2 valid tokens."""
    if inputs.values is None:
        raise ValueError("adv estimator 'gae' needs the critic's values (bsz, resp_len): set up worker.critic")
    gamma, lam, response_mask = inputs.gamma, inputs.lam, inputs.response_mask
    mask = response_mask.to(inputs.values.dtype)
    rewards, values = inputs.token_level_rewards.to(mask.dtype) * mask, inputs.values * mask
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        next_adv = m * adv_t + (1 - m) * next_adv
        next_value = m * values[:, t] + (1 - m) * next_value
        advantages[:, t] = adv_t * m
    returns = (advantages + values) * mask
    advantages = masked_whiten(advantages, response_mask) * mask
    return advantages, returns


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                       *, cliprange_value: float, loss_agg_mode: str, agg_kwargs: dict | None = None
                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss (Schulman et al. 2017, arXiv:1707.06347; baselines' ppo2),
    ``l_t = 0.5 * max((V_t - R_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - R_t)^2)`` aggregated by
    :func:`~easyrl.algorithms.loss_agg.agg_loss`. ``vpreds`` (trained), ``returns`` (targets) and ``values`` (before
    the update) are ``(bsz, resp_len)``; ``c = cliprange_value``. Returns the 0-dim loss and ``vf_clipfrac`` (share
    of valid tokens where the clipped term is larger), ``vpred_mean``. ValueError if ``c <= 0`` or the mode is
    unknown."""
    if cliprange_value <= 0:
        raise ValueError(f"cliprange_value must be > 0, got {cliprange_value}")
    clipped = values + torch.clamp(vpreds - values, -cliprange_value, cliprange_value)
    loss_unclipped = (vpreds - returns).square()
    loss_clipped = (clipped - returns).square()
    vf_losses = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    vf_loss = agg_loss(vf_losses, response_mask, loss_agg_mode, **(agg_kwargs or {}))
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": float(masked_mean((loss_clipped > loss_unclipped).float(), response_mask)),
            "vpred_mean": float(masked_mean(vpreds, response_mask)),
        }
    return vf_loss, metrics
