"""Advantage estimators for critic-free RL post-training, registered by name in :data:`ADV_ESTIMATORS`.

Every estimator takes one :class:`AdvantageInputs` and returns ``(advantages, returns)``::

    advantages, returns = compute_advantage("grpo", AdvantageInputs(token_level_rewards, response_mask, index))

Group statistics are vectorised (``np.unique`` + ``index_add_``/``scatter_reduce``). ``advantages`` and ``returns``
are ``(bsz, resp_len)``, 0 outside ``response_mask``, computed under ``torch.no_grad()``. A group of one sample has
mean 0 and std 1. ``gae`` lives in :mod:`easyrl.algorithms.critic`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from easyrl.algorithms.masked_ops import masked_whiten
from easyrl.algorithms.registry import Registry

__all__ = ["ADV_ESTIMATORS", "AdvantageInputs", "broadcast_to_tokens", "compute_advantage", "group_statistics",
           "group_sum", "sample_scores"]


@dataclass(frozen=True, eq=False)
class AdvantageInputs:
    """What an advantage estimator reads (each reads only its fields); ``ValueError`` at construction for a field of
    another shape.

    Attributes:
        token_level_rewards: ``(bsz, resp_len)``; a sample's *score* is the sum over its valid tokens.
        response_mask: ``(bsz, resp_len)`` ``{0, 1}``, 1 on the generated tokens.
        index: ``(bsz,)`` group ids (the prompt's uid; the ``n`` samples of a prompt share it).
        gamma: discount per token (``reinforce_plus_plus``, ``gae``); lam: GAE's lambda in [0, 1].
        epsilon, norm_adv_by_std_in_grpo: added to / divide by the group std (False is Dr. GRPO).
        reward_baselines: ``(bsz,)`` reward of the greedy rollout of each prompt (``remax``).
        values: ``(bsz, resp_len)`` critic values ``V(s_t)`` (``gae``).
        reward_components, reward_weights: ``(bsz, K)`` reward components and their ``K`` weights (``gdpo``).
        old_log_probs, sum_pi_squared, rollout_is_weights, teacher_log_probs: ``(bsz, resp_len)`` sampled-token
            log-probs, ``sum_v pi(v)^2``, IS weights (``optimal_token_baseline``), the teacher's log-probs.
    """

    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    index: np.ndarray
    gamma: float = 1.0
    epsilon: float = 1e-6
    norm_adv_by_std_in_grpo: bool = True
    reward_baselines: torch.Tensor | None = None
    values: torch.Tensor | None = None
    lam: float = 1.0
    reward_components: torch.Tensor | None = None
    reward_weights: tuple[float, ...] | None = None
    old_log_probs: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None
    rollout_is_weights: torch.Tensor | None = None
    teacher_log_probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rewards, mask = self.token_level_rewards, self.response_mask
        if rewards.dim() != 2 or rewards.shape != mask.shape:
            raise ValueError(
                "token_level_rewards and response_mask must both be (bsz, resp_len); got "
                f"{tuple(rewards.shape)} and {tuple(mask.shape)}"
            )
        for name in ("values", "old_log_probs", "sum_pi_squared", "rollout_is_weights", "teacher_log_probs"):
            value = getattr(self, name)
            if value is not None and value.shape != rewards.shape:
                raise ValueError(
                    f"token_level_rewards, {name} and response_mask must all be (bsz, resp_len); got "
                    f"{tuple(rewards.shape)}, {tuple(value.shape)}, {tuple(mask.shape)}"
                )
        bsz = rewards.shape[0]
        index = np.asarray(self.index)
        if index.shape != (bsz,):
            raise ValueError(f"index (group ids) must have shape (bsz,) = ({bsz},), got {index.shape}")
        object.__setattr__(self, "index", index)
        if self.reward_baselines is not None and self.reward_baselines.shape != (bsz,):
            raise ValueError(f"reward_baselines must be (bsz,) = ({bsz},), got {tuple(self.reward_baselines.shape)}")
        components = self.reward_components
        if components is not None and (components.dim() != 2 or components.shape[0] != bsz):
            raise ValueError(f"reward_components must be (bsz, K) with bsz = {bsz}, got {tuple(components.shape)}")


AdvEstimator = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]

ADV_ESTIMATORS: Registry[AdvEstimator] = Registry(
    "advantage estimator", group=False, needs_critic=False, needs_teacher=False, uses_reward=True,
    needs_reward_baselines=False, needs_sum_pi_squared=False)
"""``algorithm.adv_estimator`` -> ``fn(AdvantageInputs) -> (advantages, returns)``. Traits: ``group`` (the baseline
is the prompt's other samples, so ``n`` greedy samples make every advantage 0), ``needs_critic`` (``values``),
``needs_teacher``, ``uses_reward``, ``needs_reward_baselines``, ``needs_sum_pi_squared``: the fields it reads."""


def compute_advantage(name: str, inputs: AdvantageInputs,
                      sessions: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator ``name``; ``ValueError`` for an unknown name (listing the valid ones).

    ``sessions`` ``(bsz,)``: rows that are parts of one sample (an agent session's segments, docs/agents.md) name the
    position of that sample's scoring row (its own on a scoring row); None: every row is a sample. A ``group``
    estimator then runs on the scoring rows only, so that each session counts once in its group's statistics, and
    every other row gets its session's advantage and return (those at the scoring row's first valid token: the same
    on each of its tokens for every outcome estimator) on its own valid tokens. Any other estimator runs on every row,
    each a trajectory of its own ending in the session's reward (verl's agent loop does the same for GAE)."""
    estimator = ADV_ESTIMATORS.get(name)
    if sessions is None or not ADV_ESTIMATORS.trait(name, "group"):
        return estimator(inputs)
    sessions = np.asarray(sessions)
    scoring = np.flatnonzero(sessions == np.arange(len(sessions)))
    picked = torch.as_tensor(scoring, dtype=torch.long)
    advantages, returns = estimator(dataclasses.replace(inputs, index=inputs.index[scoring], **{
        f.name: getattr(inputs, f.name)[picked] for f in dataclasses.fields(inputs)
        if isinstance(getattr(inputs, f.name), torch.Tensor)}))
    first = inputs.response_mask[picked].to(torch.long).argmax(-1, keepdim=True)  # 0 on an empty row (advantage 0)
    slot = torch.as_tensor(np.searchsorted(scoring, sessions), dtype=torch.long)  # each row's session in `scoring`
    out = [broadcast_to_tokens(values.gather(1, first).squeeze(1)[slot], inputs.response_mask)
           for values in (advantages, returns)]
    for full, values in zip(out, (advantages, returns)):
        full[picked] = values.to(full.dtype)
    return out[0], out[1]


# ----------------------------------------------------------------------------------------------- helpers


def sample_scores(inputs: AdvantageInputs) -> torch.Tensor:
    """Outcome score per sample, ``(bsz,)``: the sum of the rewards on valid tokens."""
    return (inputs.token_level_rewards * inputs.response_mask).sum(dim=-1)


def group_sum(values: torch.Tensor, group_id: torch.Tensor) -> torch.Tensor:
    """Per-group sums of ``values`` ``(bsz, ...)`` (``group_id`` ``(bsz,)``), gathered back to each sample."""
    n_groups = int(group_id.max()) + 1 if group_id.numel() else 0
    sums = torch.zeros((n_groups, *values.shape[1:]), dtype=values.dtype, device=values.device)
    return sums.index_add_(0, group_id, values)[group_id]


def group_statistics(scores: torch.Tensor, index: np.ndarray
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(group_id, count, mean, std)`` of each sample's group, all ``(bsz,)``, from ``scores`` and ``index``
    ``(bsz,)``: ``group_id`` int64 in ``[0, n_groups)``, ``std`` unbiased; a group of one has mean 0 and std 1."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    group_id = torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=scores.device)
    count = group_sum(torch.ones_like(scores), group_id)
    mean = group_sum(scores, group_id) / count
    std = torch.sqrt(group_sum((scores - mean) ** 2, group_id) / (count - 1).clamp(min=1))
    single = count == 1
    return group_id, count, torch.where(single, 0.0, mean), torch.where(single, 1.0, std)


def broadcast_to_tokens(per_sample: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(bsz,)`` -> ``(bsz, resp_len)``, 0 outside the mask."""
    return per_sample.unsqueeze(-1) * response_mask.to(per_sample.dtype)


# --------------------------------------------------------------------------------------------- estimators


@ADV_ESTIMATORS.register("grpo", group=True)
@torch.no_grad()
def grpo_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, arXiv:2402.03300, Sec. 4.1.2, Eq. 3): ``A_i = (R_i - mean_g(R)) / (std_g(R) + eps)``
    on every valid token, ``R_i`` the sample's score. Without ``norm_adv_by_std_in_grpo``: Dr. GRPO's
    ``R_i - mean_g(R)`` (Liu et al. 2025, arXiv:2503.20783, Sec. 3.1). ``advantages`` equal ``returns``."""
    scores = sample_scores(inputs)
    _, _, mean, std = group_statistics(scores, inputs.index)
    adv = scores - mean
    if inputs.norm_adv_by_std_in_grpo:
        adv = adv / (std + inputs.epsilon)
    adv = broadcast_to_tokens(adv, inputs.response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("rloo", group=True)
@torch.no_grad()
def rloo_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019): ``A_i = R_i - sum_{j != i} R_j / (k - 1)``
    over the ``k`` samples of the group; baseline 0 for a group of one."""
    scores = sample_scores(inputs)
    group_id, count, _, _ = group_statistics(scores, inputs.index)
    leave_one_out = (group_sum(scores, group_id) - scores) / (count - 1).clamp(min=1)
    adv = broadcast_to_tokens(scores - leave_one_out, inputs.response_mask)
    return adv, adv


def _discounted_returns(rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` over valid tokens, ``(bsz, resp_len)``; a masked position gets 0 and passes
    the next valid token's return through undiscounted."""
    mask = response_mask.to(rewards.dtype)
    rewards = rewards * mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        running = m * (rewards[:, t] + gamma * running) + (1 - m) * running
        returns[:, t] = running * m
    return returns


@ADV_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): the discounted return ``G_t = sum_{s >= t} gamma^(s-t) r_s``,
    whitened over all valid tokens of the batch as the advantage. ValueError for fewer than 2 valid tokens."""
    returns = _discounted_returns(inputs.token_level_rewards, inputs.response_mask, inputs.gamma)
    adv = masked_whiten(returns, inputs.response_mask) * inputs.response_mask
    return adv, returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline", group=True)
@torch.no_grad()
def reinforce_plus_plus_baseline_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262): ``R_i - mean_g(R)`` on each token, whitened over all
    valid tokens of the batch. ValueError for fewer than 2 valid tokens."""
    response_mask = inputs.response_mask
    scores = sample_scores(inputs)
    _, _, mean, _ = group_statistics(scores, inputs.index)
    adv = broadcast_to_tokens(scores - mean, response_mask)
    adv = masked_whiten(adv, response_mask) * response_mask
    return adv, adv


@ADV_ESTIMATORS.register("remax", group=True, needs_reward_baselines=True)
@torch.no_grad()
def remax_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505, Algorithm 1): ``returns_t = sum_{s >= t} r_s`` and
    ``A_t = returns_t - b``, ``b`` the greedy response's reward. ValueError without ``reward_baselines``."""
    if inputs.reward_baselines is None:
        raise ValueError(
            "adv estimator 'remax' needs reward_baselines (bsz,): the reward of a greedy rollout per prompt; "
            "generate it (ReMax) or choose another estimator"
        )
    rewards = inputs.token_level_rewards
    mask = inputs.response_mask.to(rewards.dtype)
    returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    adv = (returns - inputs.reward_baselines.to(returns.dtype).unsqueeze(-1)) * mask
    return adv, returns


@ADV_ESTIMATORS.register("grpo_passk", group=True)
@torch.no_grad()
def grpo_passk_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage (Chen et al. 2025, arXiv:2508.10751; leave-one-out of ``max``, Tang et al. 2025,
    arXiv:2503.19595): ``A_best = R_max - R_second_max`` (divided by ``std_g(R) + eps`` when
    ``norm_adv_by_std_in_grpo``), 0 for every other sample; on ties the first in batch order is best.
    ValueError for a group of fewer than 2 samples (naming it)."""
    scores = sample_scores(inputs)
    group_id, count, _, std = group_statistics(scores, inputs.index)
    if bool((count < 2).any()):
        bad = inputs.index[int(torch.nonzero(count < 2)[0, 0])]
        raise ValueError(f"adv estimator 'grpo_passk' needs >= 2 samples per group; group {bad!r} has 1")
    n_groups = int(group_id.max()) + 1
    bsz = scores.shape[0]
    position = torch.arange(bsz, device=scores.device)
    group_max = torch.full((n_groups,), -torch.inf, dtype=scores.dtype, device=scores.device).scatter_reduce(
        0, group_id, scores, reduce="amax"
    )[group_id]
    # the first sample (lowest position) holding its group's max
    candidate = torch.where(scores == group_max, position, torch.full_like(position, bsz))
    best_pos = torch.full((n_groups,), bsz, device=scores.device).scatter_reduce(0, group_id, candidate, reduce="amin")
    is_best = position == best_pos[group_id]
    others = torch.where(is_best, torch.full_like(scores, -torch.inf), scores)
    second_max = torch.full((n_groups,), -torch.inf, dtype=scores.dtype, device=scores.device).scatter_reduce(
        0, group_id, others, reduce="amax"
    )[group_id]
    adv = torch.where(is_best, group_max - second_max, torch.zeros_like(scores))
    if inputs.norm_adv_by_std_in_grpo:
        adv = adv / (std + inputs.epsilon)
    adv = broadcast_to_tokens(adv, inputs.response_mask)
    return adv, adv
