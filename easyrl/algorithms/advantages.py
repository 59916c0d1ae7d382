"""Advantage estimators for critic-free RL post-training, registered by name in :data:`ADV_ESTIMATORS`.

Every estimator takes one :class:`AdvantageInputs` and returns ``(advantages, returns)``::

    advantages, returns = compute_advantage("grpo", AdvantageInputs(token_level_rewards, response_mask, index))

Group ids (``index``) are turned into integers with ``np.unique`` and every group statistic is computed with
``index_add_``/``scatter_reduce`` in one pass over the batch, never with a Python loop over samples. ``advantages``
and ``returns`` are ``(bsz, resp_len)``, 0 outside ``response_mask``, computed under ``torch.no_grad()``. An estimator
reads only the fields it needs, so a trainer builds the same inputs whatever the estimator.
A group with a single sample has no baseline: its group mean is taken as 0 and its std as 1 (as in verl).
The critic's estimator ``gae`` lives in :mod:`easyrl.algorithms.critic`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from easyrl.algorithms.masked_ops import masked_whiten
from easyrl.algorithms.registry import Registry

__all__ = ["ADV_ESTIMATORS", "AdvantageInputs", "broadcast_to_tokens", "compute_advantage", "group_statistics",
           "sample_scores"]


@dataclass(frozen=True, eq=False)
class AdvantageInputs:
    """What an advantage estimator reads; the shapes are checked once, at construction.

    Attributes:
        token_level_rewards: ``(bsz, resp_len)`` float, the reward of each response token (for outcome rewards all
            of it sits on the last valid token); the *score* of a sample is the sum over its valid tokens.
        response_mask: ``(bsz, resp_len)`` ``{0, 1}``, 1 on the generated tokens.
        index: ``(bsz,)`` numpy array of group ids (the prompt's uid string; the ``n`` samples of one prompt share
            it); stored as given through ``np.asarray``.
        gamma: discount per token (``reinforce_plus_plus``, ``gae``).
        epsilon: added to the group std (``grpo``, ``grpo_passk``).
        norm_adv_by_std_in_grpo: divide by the group std (``grpo``, ``grpo_passk``); False is Dr. GRPO.
        reward_baselines: ``(bsz,)`` reward of the greedy rollout of each sample's prompt (``remax``), or None.
        values: ``(bsz, resp_len)`` critic values ``V(s_t)`` (``gae``), or None.
        lam: GAE's lambda in [0, 1] (``gae``).
        reward_components: ``(bsz, K)`` the ``K`` reward components of each sample (``gdpo``), or None.
        reward_weights: ``K`` weights of the components (``gdpo``), or None for all 1.
        old_log_probs: ``(bsz, resp_len)`` log-probs of the sampled tokens (``optimal_token_baseline``), or None.
        sum_pi_squared: ``(bsz, resp_len)`` ``sum_v pi(v)^2`` over the vocabulary at each response position
            (``optimal_token_baseline``), or None.
        rollout_is_weights: ``(bsz, resp_len)`` rollout-correction IS weights (``optimal_token_baseline``), or None.
        teacher_log_probs: ``(bsz, resp_len)`` the distillation teacher's log-probs of the sampled tokens
            (``on_policy_distill``, with ``old_log_probs`` as the student's), or None.

    Raises:
        ValueError: if ``token_level_rewards`` is not 2-D or its shape differs from ``response_mask``'s or (when
            given) ``values``'s, if ``index`` is not ``(bsz,)``, or if ``reward_baselines`` is given and not
            ``(bsz,)``.
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
"""``algorithm.adv_estimator`` -> estimator ``fn(inputs: AdvantageInputs) -> (advantages, returns)``. Traits:
``group``: the baseline is the prompt's other samples (ReMax: its greedy response), so ``n`` identical (greedy)
samples make every advantage 0; ``needs_critic``: reads ``values`` (a learned value model); ``needs_teacher``: reads
``teacher_log_probs``; ``uses_reward``: the advantage depends on the reward; ``needs_reward_baselines``: reads
``reward_baselines`` (the greedy response's reward); ``needs_sum_pi_squared``: reads ``sum_pi_squared``."""


def compute_advantage(name: str, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator registered as ``name``; raises ``ValueError`` for an unknown name (listing the valid ones)
    or what the estimator raises."""
    return ADV_ESTIMATORS.get(name)(inputs)


# ----------------------------------------------------------------------------------------------- helpers


def sample_scores(inputs: AdvantageInputs) -> torch.Tensor:
    """Outcome score per sample, ``(bsz,)``: the sum of the rewards on valid tokens."""
    return (inputs.token_level_rewards * inputs.response_mask).sum(dim=-1)


def group_statistics(
    scores: torch.Tensor, index: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample statistics of the sample's group, computed vectorised over groups.

    Args:
        scores: ``(bsz,)`` float.
        index: ``(bsz,)`` group ids (any hashable numpy dtype, usually uid strings).

    Returns:
        ``(group_id, count, mean, std)``: ``group_id`` ``(bsz,)`` int64 in ``[0, n_groups)``; ``count``, ``mean``,
        ``std`` ``(bsz,)``, the size, mean and unbiased standard deviation (like ``torch.std``) of the sample's
        group. A group of size 1 gets mean 0 and std 1.
    """
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    group_id = torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=scores.device)
    n_groups = int(group_id.max()) + 1 if group_id.numel() else 0
    counts = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, group_id, torch.ones_like(scores)
    )
    sums = torch.zeros_like(counts).index_add_(0, group_id, scores)
    group_mean = sums / counts
    sq_dev = torch.zeros_like(counts).index_add_(0, group_id, (scores - group_mean[group_id]) ** 2)
    group_std = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))
    single = counts == 1
    group_mean = torch.where(single, torch.zeros_like(group_mean), group_mean)
    group_std = torch.where(single, torch.ones_like(group_std), group_std)
    return group_id, counts[group_id], group_mean[group_id], group_std[group_id]


def broadcast_to_tokens(per_sample: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(bsz,)`` -> ``(bsz, resp_len)``, 0 outside the mask."""
    return per_sample.unsqueeze(-1) * response_mask.to(per_sample.dtype)


# --------------------------------------------------------------------------------------------- estimators


@ADV_ESTIMATORS.register("grpo", group=True)
@torch.no_grad()
def grpo_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, Sec. 4.1.2 and Eq. 3).

    ``A_i = (R_i - mean_group(R)) / (std_group(R) + epsilon)`` for every valid token of sample ``i``, where
    ``R_i`` is the sum of the sample's token rewards and ``std`` is unbiased (``torch.std``).

    With ``norm_adv_by_std_in_grpo=False`` this is Dr. GRPO's advantage ``A_i = R_i - mean_group(R)``
    (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783, Sec. 3.1:
    the std division biases updates towards too easy / too hard questions). Dr. GRPO's other change, removing
    the ``1/|o_i|`` length normalisation, belongs to the loss: ``loss_agg_mode="seq-mean-token-sum-norm"``.
    ``advantages`` and ``returns`` are equal.
    """
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
    """REINFORCE Leave-One-Out advantage (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs", arXiv:2402.14740; the estimator is Kool et al. 2019,
    "Buy 4 REINFORCE Samples, Get a Baseline for Free!").

    ``A_i = R_i - (1 / (k - 1)) * sum_{j != i} R_j`` over the ``k`` samples of the group, which equals
    ``k / (k - 1) * (R_i - mean_group(R))``. A group of size 1 has no other sample: its baseline is 0.
    """
    scores = sample_scores(inputs)
    group_id, count, _, _ = group_statistics(scores, inputs.index)
    group_sum = torch.zeros(int(group_id.max()) + 1, dtype=scores.dtype, device=scores.device).index_add_(
        0, group_id, scores
    )[group_id]
    leave_one_out = (group_sum - scores) / (count - 1).clamp(min=1)
    adv = broadcast_to_tokens(scores - leave_one_out, inputs.response_mask)
    return adv, adv


def _discounted_returns(rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` over valid tokens, right to left, ``(bsz, resp_len)``.

    A masked position has reward 0, passes the return of the next valid token through undiscounted and gets
    ``G_t = 0`` itself; for the usual left-aligned responses (mask = 1...1 0...0) this is the plain discounted
    return that restarts at the end of each response.
    """
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
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    arXiv:2501.03262): token-level discounted return ``G_t = sum_{s >= t} gamma^(s-t) r_s`` (the
    per-token KL penalty, when used, is already inside ``token_level_rewards``), then global advantage
    normalisation: ``advantages`` are the ``returns`` whitened over all valid tokens of the batch (no groups).

    Raises:
        ValueError: when the batch has fewer than 2 valid tokens.
    """
    returns = _discounted_returns(inputs.token_level_rewards, inputs.response_mask, inputs.gamma)
    adv = masked_whiten(returns, inputs.response_mask) * inputs.response_mask
    return adv, returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline", group=True)
@torch.no_grad()
def reinforce_plus_plus_baseline_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262, the "REINFORCE++-baseline" variant for
    several samples per prompt): ``A_i = R_i - mean_group(R)`` broadcast over the valid tokens, then whitened
    over all valid tokens of the batch (global, not per-group, std normalisation).

    Raises:
        ValueError: when the batch has fewer than 2 valid tokens.
    """
    response_mask = inputs.response_mask
    scores = sample_scores(inputs)
    _, _, mean, _ = group_statistics(scores, inputs.index)
    adv = broadcast_to_tokens(scores - mean, response_mask)
    adv = masked_whiten(adv, response_mask) * response_mask
    return adv, adv


@ADV_ESTIMATORS.register("remax", group=True, needs_reward_baselines=True)
@torch.no_grad()
def remax_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
    Large Language Models", arXiv:2310.10505, Algorithm 1): the baseline is the reward of the greedy response
    to the same prompt.

    ``returns_t = sum_{s >= t} r_s`` (undiscounted reward-to-go over valid tokens) and
    ``advantages_t = returns_t - reward_baselines``.

    Raises:
        ValueError: if ``reward_baselines`` is None.
    """
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
    """Pass@k-style outcome advantage. The group is rewarded by its best sample (``max_j R_j``, the pass@k reward when ``k`` equals the group
    size; Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large
    Reasoning Models", arXiv:2508.10751). The leave-one-out gradient of ``max`` credits only the best sample,
    by how much the group's max would drop without it (Tang et al. 2025, "Optimizing Language Models for
    Inference Time Objectives using Reinforcement Learning", arXiv:2503.19595):

    ``A_best = R_max - R_second_max`` (divided by ``std_group(R) + epsilon`` when
    ``norm_adv_by_std_in_grpo``), and ``A = 0`` for every other sample. On ties the first sample (in batch
    order) holding the max is "best" and its advantage is 0 anyway.

    Raises:
        ValueError: when a group has fewer than 2 samples (naming the group id).
    """
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
