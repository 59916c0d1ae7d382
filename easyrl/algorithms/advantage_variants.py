"""More advantage estimators for :data:`~easyrl.algorithms.advantages.ADV_ESTIMATORS` (``opo``, ``gpg``, ``gdpo``,
``optimal_token_baseline``), with the contract of :mod:`~easyrl.algorithms.advantages`."""

from __future__ import annotations

import torch

from easyrl.algorithms.advantages import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    broadcast_to_tokens,
    group_statistics,
    group_sum,
    sample_scores,
)
from easyrl.algorithms.masked_ops import masked_whiten

__all__ = ["gdpo_advantage", "gpg_advantage", "opo_advantage", "optimal_token_baseline_advantage"]

OTB_EPSILON = 1e-8  # added to the optimal token baseline's denominator


@ADV_ESTIMATORS.register("opo", group=True)
@torch.no_grad()
def opo_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025, arXiv:2505.23585, Eq. 5): ``A_i = R_i - sum_j |o_j| R_j / sum_j |o_j|`` over the
    group, the length-weighted mean reward (``|o_j|`` valid tokens); baseline 0 for a group of one."""
    scores = sample_scores(inputs)
    lengths = inputs.response_mask.sum(dim=-1).to(scores.dtype)
    group_id, count, _, _ = group_statistics(scores, inputs.index)
    baseline = group_sum(lengths * scores, group_id) / group_sum(lengths, group_id).clamp(min=1)
    adv = broadcast_to_tokens(scores - torch.where(count > 1, baseline, 0.0), inputs.response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("gpg", group=True)
@torch.no_grad()
def gpg_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025, arXiv:2504.02546, the corrected advantage): ``A_i = B / max(1, M) * (R_i - mean_g(R))``,
    ``B`` the batch size, ``M`` the samples with a non-zero score. Pair with ``worker.actor.loss_type: gpg``."""
    scores = sample_scores(inputs)
    _, _, mean, _ = group_statistics(scores, inputs.index)
    alpha = scores.shape[0] / max(1, int(torch.count_nonzero(scores)))
    adv = broadcast_to_tokens(alpha * (scores - mean), inputs.response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("gdpo", group=True)
@torch.no_grad()
def gdpo_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (arXiv:2601.05242): each reward component normalised in its group,
    ``A_k,i = (r_k,i - mean_g(r_k)) / (std_g(r_k) + eps)`` (no std without ``norm_adv_by_std_in_grpo``), then
    ``whiten(sum_k w_k A_k,i)`` over all valid tokens; without ``reward_components`` the one component is the score.
    ValueError for fewer than 2 valid tokens or a weight count other than ``K``."""
    components = inputs.reward_components
    if components is None:
        components = sample_scores(inputs).unsqueeze(-1)
    weights = inputs.reward_weights or (1.0,) * components.shape[1]
    if len(weights) != components.shape[1]:
        raise ValueError(f"gdpo: {len(weights)} reward_weights for {components.shape[1]} reward components")
    total = torch.zeros(components.shape[0], dtype=components.dtype, device=components.device)
    for k, weight in enumerate(weights):
        _, _, mean, std = group_statistics(components[:, k], inputs.index)
        adv_k = components[:, k] - mean
        if inputs.norm_adv_by_std_in_grpo:
            adv_k = adv_k / (std + inputs.epsilon)
        total = total + weight * adv_k
    mask = inputs.response_mask
    adv = masked_whiten(broadcast_to_tokens(total, mask), mask) * mask
    return adv, adv


def _zero_tail(lengths: torch.Tensor, group_id: torch.Tensor, count: torch.Tensor, resp_len: int) -> torch.Tensor:
    """``(bsz, resp_len)`` bool: the positions of a group's unique longest response past the second-longest length."""
    n_groups = int(group_id.max()) + 1
    longest = torch.zeros(n_groups, dtype=lengths.dtype, device=lengths.device).scatter_reduce(
        0, group_id, lengths, reduce="amax", include_self=False)[group_id]
    is_longest = lengths == longest
    n_longest = group_sum(is_longest.to(lengths.dtype), group_id)
    others = torch.where(is_longest, torch.full_like(lengths, -1), lengths)
    second = torch.full((n_groups,), -1, dtype=lengths.dtype, device=lengths.device).scatter_reduce(
        0, group_id, others, reduce="amax")[group_id]
    tail_row = is_longest & (n_longest == 1) & (count > 1) & (second >= 0)
    positions = torch.arange(resp_len, device=lengths.device)
    return tail_row.unsqueeze(-1) & (positions.unsqueeze(0) >= second.unsqueeze(-1))


@ADV_ESTIMATORS.register("optimal_token_baseline", group=True, needs_sum_pi_squared=True)
@torch.no_grad()
def optimal_token_baseline_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline (Weaver & Tao 2001, UAI: ``b* = E[G ||grad log pi||^2] / E[||grad log pi||^2]``, per
    token position). ``s_j = 1 - 2 pi_j + sum_v pi(v)^2`` is the squared score norm at step ``j`` (times ``rho_j^2``
    with IS weights), ``W_t = sum_{j <= t} m_j s_j``, ``G_t`` the reward-to-go (returned as ``returns``):
    ``B_t = sum_i m_it G_it W_it / (sum_i m_it W_it + 1e-8)``, ``A_it = (G_it - B_t) m_it``. Baseline 0 for a group
    of one and past the second-longest length of a unique longest response. ValueError without ``old_log_probs``
    or ``sum_pi_squared``."""
    if inputs.old_log_probs is None or inputs.sum_pi_squared is None:
        raise ValueError("adv estimator 'optimal_token_baseline' needs old_log_probs and sum_pi_squared (bsz, "
                         "resp_len): the sampled token's log-prob and sum_v pi(v)^2 at each response position")
    mask = inputs.response_mask.to(inputs.token_level_rewards.dtype)
    returns = (inputs.token_level_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    score_norm = 1 - 2 * torch.exp(inputs.old_log_probs) + inputs.sum_pi_squared
    if inputs.rollout_is_weights is not None:
        score_norm = score_norm * inputs.rollout_is_weights.square()
    path = (score_norm * mask).cumsum(-1)
    group_id, count, _, _ = group_statistics(sample_scores(inputs), inputs.index)
    baseline = group_sum(returns * path * mask, group_id) / (group_sum(path * mask, group_id) + OTB_EPSILON)
    baseline = torch.where((count > 1).unsqueeze(-1), baseline, 0.0)
    # where each response ends (past its last trained token): its length for one turn, not the token count of a
    # multi-turn response, whose tool turns are 0s inside the mask
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    lengths = torch.where(inputs.response_mask.bool(), positions, 0).amax(-1).long()
    baseline = baseline.masked_fill(_zero_tail(lengths, group_id, count, mask.shape[1]), 0.0)
    return (returns - baseline) * mask, returns
