"""Loss aggregation and policy-gradient losses.

Global normalisation (what makes the loss independent of how a mini-batch is split): a mini-batch is split over
``dp_size`` data-parallel ranks and, on each rank, into micro-batches whose gradients are *summed*
(accumulated); the FSDP all-reduce then *averages* over ranks. If every micro-batch divides by the
denominator of the whole mini-batch (``global_num_tokens`` / ``global_num_seqs``, counted over all ranks)
and multiplies by ``dp_size``, then::

    mean_over_ranks( sum_over_micro_batches( agg_loss(micro, global counts, dp_size) ) ) == agg_loss(mini-batch)

for the value and for the gradient (``tests/test_losses.py`` checks both). Per-micro-batch means would instead
weight a token by ``1 / tokens in its micro-batch``, which depends on the split.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from easyrl.algorithms.masked_ops import masked_mean, masked_sum

__all__ = [
    "LOSS_AGG_MODES",
    "agg_loss",
    "mask_counts",
    "POLICY_LOSSES",
    "register_policy_loss",
    "get_policy_loss",
    "sapo_gate",
    "compute_tis_weights",
]

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "seq-mean-token-sum-norm-drgrpo",
)

_LOG_RATIO_CLAMP = 20.0  # |log pi/pi_old| above this is clamped before exp (exp(20) ~ 4.9e8)


def mask_counts(loss_mask: torch.Tensor) -> tuple[int, int]:
    """Local denominators of :func:`agg_loss` for one rank's share of a mini-batch.

    Args:
        loss_mask: ``(bsz, resp_len)`` ``{0, 1}``.

    Returns:
        ``(num_tokens, num_seqs)``: valid tokens, and sequences with at least one valid token. Sum them over the
        micro-batches of a rank and all-reduce (sum) over ranks to get ``global_num_tokens``/``global_num_seqs``.
    """
    valid = loss_mask.bool()
    return int(valid.sum()), int(valid.any(dim=-1).sum())


def _denominator(global_count, local_count: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    count = local_count if global_count is None else global_count
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp(min=1)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    global_num_tokens: int | torch.Tensor | None = None,
    global_num_seqs: int | torch.Tensor | None = None,
    dp_size: int = 1,
    norm_length: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix to the scalar a micro-batch back-propagates.

    Modes (``m`` the mask, ``n_i = sum_t m_it``, ``T`` the number of valid tokens, ``S`` the number of
    sequences with ``n_i > 0``, both over the whole mini-batch when the global counts are given):

    * ``"token-mean"``: ``sum_it m_it l_it / T``. Every token weighs the same (DAPO's token-level loss,
      Yu et al. 2025, arXiv:2503.14476, Sec. 3.3).
    * ``"seq-mean-token-sum"``: ``sum_i (sum_t m_it l_it) / S``.
    * ``"seq-mean-token-mean"``: ``sum_i (sum_t m_it l_it / n_i) / S`` (the original GRPO objective,
      Shao et al. 2024, Eq. 3: ``1/G sum_i 1/|o_i| sum_t``).
    * ``"seq-mean-token-sum-norm"`` (verl's mode of this name): ``sum_i (sum_t m_it l_it) / L``, a *sum* over the
      sequences (no ``1/S``, despite the name; verl's docs: "turns off seq-dim averaging") divided by the constant
      ``L = norm_length`` (default ``loss_mat.shape[-1]``, the padded response length). The loss scale grows with
      the mini-batch size.
    * ``"seq-mean-token-sum-norm-drgrpo"``: ``sum_i (sum_t m_it l_it / L) / S``, Dr. GRPO's length-unbiased loss as in
      its paper and reference implementation (Liu et al. 2025, arXiv:2503.20783, Sec. 3.1 and sail-sg/oat: divide by
      the generation budget instead of ``|o_i|``, average over the ``G`` sequences). It is exactly
      ``1/S`` times ``"seq-mean-token-sum-norm"``.

    Pass the configured max response length as ``norm_length`` when micro-batches may be padded to different
    lengths, otherwise the constant ``L`` differs between them.

    Every mode is then multiplied by ``dp_size`` (see the module docstring). Empty denominators count as 1, so a
    micro-batch without valid tokens gives 0.

    Args:
        loss_mat: ``(bsz, resp_len)`` per-token loss.
        loss_mask: ``(bsz, resp_len)`` ``{0, 1}``.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.
        global_num_tokens: valid tokens in the whole mini-batch over all ranks (``None``: this batch's count).
        global_num_seqs: sequences with >= 1 valid token in the whole mini-batch over all ranks (``None``: local).
        dp_size: number of data-parallel ranks averaging gradients.
        norm_length: the constant ``L`` of the two ``"seq-mean-token-sum-norm*"`` modes.

    Returns:
        0-dim tensor.

    Raises:
        ValueError: for an unknown mode (the message lists the valid ones) or mismatched shapes.
    """
    if loss_mat.shape != loss_mask.shape or loss_mat.dim() != 2:
        raise ValueError(
            f"agg_loss: loss_mat and loss_mask must both be (bsz, resp_len); got {tuple(loss_mat.shape)} "
            f"and {tuple(loss_mask.shape)}"
        )
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {list(LOSS_AGG_MODES)}")
    valid = loss_mask.bool()
    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, valid) / _denominator(global_num_tokens, valid.sum(), loss_mat) * dp_size
    seq_valid = valid.any(dim=-1)
    seq_loss = masked_sum(loss_mat, valid, dim=-1)  # (bsz,)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_loss = seq_loss / valid.sum(dim=-1).clamp(min=1).to(seq_loss.dtype)
    elif loss_agg_mode.startswith("seq-mean-token-sum-norm"):
        seq_loss = seq_loss / (loss_mat.shape[-1] if norm_length is None else norm_length)
        if loss_agg_mode == "seq-mean-token-sum-norm":  # verl: a sum over sequences
            return masked_sum(seq_loss, seq_valid) * dp_size
    return masked_sum(seq_loss, seq_valid) / _denominator(global_num_seqs, seq_valid.sum(), loss_mat) * dp_size


# ------------------------------------------------------------------------------------------ policy losses

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator adding a policy loss to :data:`POLICY_LOSSES` under ``name``.

    Raises:
        ValueError: if ``name`` is already taken by a different function.
    """

    def decorator(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES and POLICY_LOSSES[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered ({POLICY_LOSSES[name]!r})")
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """Return the policy loss registered as ``name``.

    Raises:
        ValueError: if ``name`` is unknown; the message lists the valid names.
    """
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; valid names: {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


def _finish(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    agg_kwargs: dict | None,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Apply the (detached) truncated-IS weights, then aggregate."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **(agg_kwargs or {}))


def _metrics(clipfrac, clipfrac_lower, ppo_kl) -> dict[str, float]:
    return {"pg_clipfrac": float(clipfrac), "pg_clipfrac_lower": float(clipfrac_lower), "ppo_kl": float(ppo_kl)}


# All policy losses share this signature:
#   fn(old_log_prob, log_prob, advantages, response_mask,      # (bsz, resp_len) each
#      *, loss_agg_mode, clip_ratio_low, clip_ratio_high, clip_ratio_dual,
#      agg_kwargs=None, rollout_is_weights=None, **settings) -> (pg_loss 0-dim tensor, metrics dict of floats)
# ``settings`` carries the loss-specific keys of ``worker.actor`` (SAPO's tau_positive / tau_negative); a loss
# ignores the ones it does not use, so the actor calls every loss the same way.
# metrics: pg_clipfrac (fraction of valid tokens where clipping changed the loss), pg_clipfrac_lower
# (fraction where the dual clip engaged; 0 for losses without one), ppo_kl (masked mean of old - new log-prob).


@register_policy_loss("vanilla")
def vanilla_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_dual: float,
    agg_kwargs: dict | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **settings: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, Eq. 7) with decoupled clip range
    ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` (DAPO "clip-higher", Yu et al. 2025, arXiv:2503.14476, Sec. 3.1)
    and dual clip for negative advantages (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep
    Reinforcement Learning", arXiv:1912.09729, Eq. 5).

    With ``r = exp(clamp(logp - logp_old, -20, 20))`` and ``c = clip_ratio_dual``, per token:

    * ``A >= 0``: ``l = max(-A r, -A clip(r))``;
    * ``A < 0``:  ``l = min(max(-A r, -A clip(r)), -A c)`` (bounds the loss when ``r`` explodes).

    Args:
        old_log_prob: ``(bsz, resp_len)`` log-probs of the policy that sampled the data (no gradient).
        log_prob: ``(bsz, resp_len)`` log-probs of the current policy (gradient flows here).
        advantages: ``(bsz, resp_len)``.
        response_mask: ``(bsz, resp_len)`` ``{0, 1}``.
        loss_agg_mode: see :func:`agg_loss`.
        clip_ratio_low, clip_ratio_high: clip range ``[1 - low, 1 + high]``.
        clip_ratio_dual: dual-clip constant ``c`` > 1.
        agg_kwargs: keyword arguments for :func:`agg_loss` (``global_num_tokens``, ``global_num_seqs``,
            ``dp_size``, ``norm_length``).
        rollout_is_weights: optional ``(bsz, resp_len)`` truncated-IS weights (see :func:`compute_tis_weights`),
            multiplied into the per-token loss (detached).

    Returns:
        ``(pg_loss, metrics)`` with metrics ``pg_clipfrac``, ``pg_clipfrac_lower`` (dual clip), ``ppo_kl``.

    Raises:
        ValueError: if ``clip_ratio_dual <= 1`` or the mode is unknown.
    """
    if clip_ratio_dual <= 1.0:
        raise ValueError(f"clip_ratio_dual must be > 1 (dual-clip PPO), got {clip_ratio_dual}")
    log_ratio = torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    dual_bound = -advantages * clip_ratio_dual
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(clip_loss, dual_bound), clip_loss)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, agg_kwargs, rollout_is_weights)
    with torch.no_grad():
        metrics = _metrics(
            masked_mean((loss_clipped > loss_unclipped).float(), response_mask),
            masked_mean((negative & (clip_loss > dual_bound)).float(), response_mask),
            masked_mean(old_log_prob - log_prob, response_mask),
        )
    return pg_loss, metrics


@register_policy_loss("gspo")
def gspo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_dual: float,
    agg_kwargs: dict | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **settings: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group Sequence Policy Optimization, token form "GSPO-token" (Zheng et al. 2025, arXiv:2507.18071).

    Sequence ratio ``s_i = exp(mean_t(logp_it - logp_old_it))`` (the length-normalised sequence likelihood
    ratio), token ratio ``s_it = sg[s_i] * exp(logp_it - sg[logp_it])``: its value is ``s_i`` on every token of
    sequence ``i`` (so clipping is decided per sequence) while its gradient is ``s_i * grad logp_it``, which
    lets token-level advantages flow. Per token ``l = max(-A s_it, -A clip(s_it, 1 - low, 1 + high))``. With
    one advantage per sequence this equals GSPO's sequence objective.

    Notes:
        * The paper averages over sequences (``1/G sum_i``) and uses the tiny ranges 3e-4 / 4e-4; use
          ``loss_agg_mode="seq-mean-token-mean"`` to match it. The given mode is honoured (verl forces
          seq-mean-token-mean).
        * ``clip_ratio_dual`` is unused (no dual clip in GSPO); ``pg_clipfrac_lower`` is 0.
        * ``log s_i`` is clamped to [-20, 20] before ``exp``.

    Args / Returns / Raises: as :func:`vanilla_policy_loss` (no ValueError for ``clip_ratio_dual``).
    """
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(log_ratio, response_mask, dim=-1).detach()  # (bsz,)
    seq_log_ratio = torch.clamp(seq_log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    token_ratio = torch.exp(seq_log_ratio.unsqueeze(-1) + log_prob - log_prob.detach())
    loss_unclipped = -advantages * token_ratio
    loss_clipped = -advantages * torch.clamp(token_ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, agg_kwargs, rollout_is_weights)
    with torch.no_grad():
        metrics = _metrics(
            masked_mean((loss_clipped > loss_unclipped).float(), response_mask),
            0.0,
            masked_mean(-log_ratio, response_mask),
        )
    return pg_loss, metrics


@register_policy_loss("cispo")
def cispo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_dual: float,
    agg_kwargs: dict | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **settings: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO, clipped IS-weight policy optimisation (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute
    Efficiently with Lightning Attention", arXiv:2506.13585, Eq. 4-5).

    ``l_t = -sg(clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A_t * logp_t`` with
    ``r_t = exp(clamp(logp_t - logp_old_t, -20, 20))``: the IS weight is clipped and detached, but no token's
    gradient is ever dropped (unlike PPO clipping). Bounds: the paper's ``eps_low^IS`` / ``eps_high^IS`` are
    ``clip_ratio_low`` / ``clip_ratio_high``; the paper effectively disables the lower bound (large
    ``eps_low^IS``), which here means ``clip_ratio_low >= 1``. The paper normalises by the total number of
    tokens, i.e. ``loss_agg_mode="token-mean"``.

    ``clip_ratio_dual`` is unused. Metrics: ``pg_clipfrac`` = fraction of valid tokens whose IS weight was
    clipped (either bound); ``pg_clipfrac_lower`` = 0 (no dual clip).

    Args / Returns / Raises: as :func:`vanilla_policy_loss` (no ValueError for ``clip_ratio_dual``).
    """
    log_ratio = torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio).detach()
    weight = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = -weight * advantages * log_prob
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, agg_kwargs, rollout_is_weights)
    with torch.no_grad():
        metrics = _metrics(
            masked_mean((weight != ratio).float(), response_mask),
            0.0,
            masked_mean(old_log_prob - log_prob, response_mask),
        )
    return pg_loss, metrics


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


@register_policy_loss("sapo")
def sapo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_dual: float,
    agg_kwargs: dict | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    tau_positive: float = 1.0,
    tau_negative: float = 1.05,
    **settings: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Soft Adaptive Policy Optimization (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347,
    the SAPO objective and its gate ``f``).

    Per token ``l_t = -A_t * f(r_t; tau_t)`` with ``r_t = exp(clamp(logp_t - logp_old_t, -20, 20))``, the soft gate
    :func:`sapo_gate`, and ``tau_t = tau_positive`` where ``A_t > 0``, ``tau_negative`` otherwise (negative
    advantages get the larger temperature: their gradient decays faster off-policy, which the paper finds
    stabilises training). No hard clipping: ``clip_ratio_*`` are unused.

    Notes:
        * The paper averages each sequence's token mean over the group (``1/G sum_i 1/|y_i| sum_t``), i.e.
          ``loss_agg_mode="seq-mean-token-mean"``, which verl forces; easyrl honours the configured mode (as EasyR1
          does) and warns at config load when it differs.
        * Metrics: ``pg_clipfrac`` and ``pg_clipfrac_lower`` are 0 (nothing is clipped), as in verl.

    Args:
        tau_positive, tau_negative: gate temperatures > 0 (``worker.actor.tau_positive`` / ``tau_negative``;
            EasyR1's and verl's defaults 1.0 / 1.05).
        others: as :func:`vanilla_policy_loss`.

    Returns:
        ``(pg_loss, metrics)`` as :func:`vanilla_policy_loss`.

    Raises:
        ValueError: if a temperature is not positive, or the mode is unknown.
    """
    if not (tau_positive > 0 and tau_negative > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got tau_positive={tau_positive}, tau_negative={tau_negative}")
    log_ratio = torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, float(tau_positive), float(tau_negative)).to(ratio.dtype)
    pg_losses = -advantages * sapo_gate(ratio, tau)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, agg_kwargs, rollout_is_weights)
    with torch.no_grad():
        metrics = _metrics(0.0, 0.0, masked_mean(old_log_prob - log_prob, response_mask))
    return pg_loss, metrics


# ------------------------------------------------------------------------------- rollout correction (TIS)


@torch.no_grad()
def compute_tis_weights(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance-sampling weights correcting the rollout engine / trainer mismatch (Yao et al. 2025,
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", blog,
    https://fengyao.notion.site/off-policy-rl): the rollout engine (vLLM) samples from ``pi_rollout`` while the
    loss assumes ``pi_old`` (the trainer's recomputation), so each token is reweighted by
    ``w = min(pi_old / pi_rollout, cap)``.

    Args:
        old_log_prob: ``(bsz, resp_len)`` log-probs recomputed by the trainer before the update.
        rollout_log_probs: ``(bsz, resp_len)`` log-probs reported by the rollout engine for the same tokens.
        response_mask: ``(bsz, resp_len)`` ``{0, 1}``.
        cap: truncation ``C`` > 0 (the blog uses 2).

    Returns:
        ``(weights, metrics)``: ``weights`` ``(bsz, resp_len)`` detached, 0 outside the mask; metrics (floats):

        * ``rollout/tis_weight_mean``: masked mean of the truncated weights;
        * ``rollout/tis_clip_frac``: fraction of valid tokens whose raw weight exceeded ``cap``;
        * ``rollout/probs_diff_mean`` / ``rollout/probs_diff_max``: masked mean / max of
          ``|exp(rollout_logp) - exp(old_logp)|``, the token-probability gap;
        * ``rollout/log_ppl_diff``: mean over non-empty sequences of
          ``mean_t(rollout_logp) - mean_t(old_logp) = log PPL_old - log PPL_rollout`` (> 0: the trainer finds the
          rollouts less likely than the engine did).

    Raises:
        ValueError: if ``cap <= 0``.
    """
    if cap <= 0:
        raise ValueError(f"compute_tis_weights: cap must be > 0, got {cap}")
    valid = response_mask.bool()
    log_w = torch.clamp(old_log_prob - rollout_log_probs, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
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
