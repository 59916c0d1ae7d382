"""Per-token KL estimators, KL-coefficient controllers and the in-reward KL penalty.

The estimators follow J. Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html):
with samples drawn from the policy ``pi`` and ``x = ref_logp - logp = log(pi_ref / pi)``,

* ``k1 = -x = logp - ref_logp``      unbiased for KL(pi || pi_ref), high variance, can be negative;
* ``k2 = x^2 / 2``                    biased, low variance, always >= 0;
* ``k3 = exp(x) - x - 1``             unbiased, low variance, always >= 0.

A name with a trailing ``+`` keeps the value but takes k2's gradient (straight-through), see :func:`kl_penalty`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from easyrl.algorithms.masked_ops import masked_mean

__all__ = [
    "KL_ESTIMATORS",
    "kl_penalty",
    "FixedKLController",
    "AdaptiveKLController",
    "make_kl_controller",
    "apply_kl_penalty",
]

_BASE_ESTIMATORS = ("kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3")
KL_ESTIMATORS = _BASE_ESTIMATORS + tuple(f"{name}+" for name in _BASE_ESTIMATORS)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the log-probs of the sampled tokens.

    Args:
        log_prob: ``(bsz, resp_len)`` log-probs (nats) of the sampled tokens under the policy.
        ref_log_prob: ``(bsz, resp_len)`` log-probs under the reference policy.
        estimator: ``"kl"``/``"k1"``: ``logp - ref``; ``"abs"``: ``|logp - ref|``; ``"mse"``/``"k2"``:
            ``0.5 (logp - ref)^2``; ``"low_var_kl"``/``"k3"``: ``exp(ref - logp) - (ref - logp) - 1`` with
            ``ref - logp`` clamped to [-20, 20] before ``exp`` (no overflow) and the result clamped to [-10, 10]
            (bounds the penalty of the rare token the reference finds far likelier than the policy). Any of these
            with a trailing ``+`` (straight-through, e.g. ``"k3+"``): the same value, but the
            gradient of k2, ``(logp - ref) * grad logp``, an unbiased estimate of the gradient of KL(pi || pi_ref)
            on samples of ``pi`` (k3's own gradient estimates that of the forward KL(pi_ref || pi); k1's is 0 in
            expectation).

    Returns:
        ``(bsz, resp_len)``, differentiable w.r.t. both inputs. Not masked: multiply by the response mask.

    Raises:
        ValueError: for an unknown estimator; the message lists the valid names.
    """
    if estimator.endswith("+") and estimator[:-1] in _BASE_ESTIMATORS:
        value = kl_penalty(log_prob, ref_log_prob, estimator[:-1]).detach()
        k2 = 0.5 * (log_prob - ref_log_prob).square()
        return value + (k2 - k2.detach())
    diff = log_prob - ref_log_prob
    if estimator in ("kl", "k1"):
        return diff
    if estimator == "abs":
        return diff.abs()
    if estimator in ("mse", "k2"):
        return 0.5 * diff.square()
    if estimator in ("low_var_kl", "k3"):
        x = torch.clamp(-diff, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(x) - x - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; valid names: {list(KL_ESTIMATORS)}")


class KLController(Protocol):
    """What :func:`apply_kl_penalty` needs from a controller."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


class FixedKLController:
    """A constant KL coefficient ``beta`` (``value``)."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Does nothing (the coefficient is fixed)."""


class AdaptiveKLController:
    """Proportional controller steering the measured KL to a target (Ziegler et al. 2019, "Fine-Tuning Language
    Models from Human Preferences", arXiv:1909.08593, Sec. 2.2):

    ``e = clip(KL / target - 1, -0.2, 0.2)``, ``beta <- beta * (1 + e * n_steps / horizon)``.

    Args:
        init_kl_coef: initial ``beta``.
        target_kl: KL (nats per token here) the controller aims at, > 0.
        horizon: number of samples over which the error is corrected, > 0 (``K_beta`` in the paper).

    Raises:
        ValueError: if ``target_kl`` or ``horizon`` is not positive.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if target_kl <= 0:
            raise ValueError(f"AdaptiveKLController: target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"AdaptiveKLController: horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Multiply ``value`` by ``1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon``
        (``current_kl``: the last batch's KL, ``n_steps``: its number of samples)."""
        error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(kl_type: str, kl_coef: float, kl_target: float, kl_horizon: float) -> KLController:
    """The in-reward KL coefficient's controller named by ``algorithm.kl_type``.

    Args:
        kl_type: ``"fixed"`` (:class:`FixedKLController`) or ``"adaptive"`` (:class:`AdaptiveKLController`).
        kl_coef: the (initial) coefficient.
        kl_target, kl_horizon: the adaptive controller's target KL and horizon (ignored by ``"fixed"``).

    Raises:
        ValueError: for another ``kl_type``, or a non-positive target / horizon with ``"adaptive"``.
    """
    if kl_type == "fixed":
        return FixedKLController(kl_coef)
    if kl_type == "adaptive":
        return AdaptiveKLController(kl_coef, kl_target, kl_horizon)
    raise ValueError(f"unknown algorithm.kl_type {kl_type!r}; valid: fixed, adaptive")


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    estimator: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Subtract a per-token KL penalty from the rewards (KL "in reward", as in Ziegler et al. 2019, Eq. 2):
    ``r_t = score_t - beta * kl_t`` on valid tokens, ``beta = kl_ctrl.value``.

    Afterwards the controller is updated with the batch KL (mean over sequences of each sequence's token-mean
    KL) and ``n_steps = bsz``.

    Args:
        token_level_scores: ``(bsz, resp_len)`` rewards before the penalty.
        old_log_prob: ``(bsz, resp_len)`` log-probs of the rollout policy (recomputed by the actor).
        ref_log_prob: ``(bsz, resp_len)`` log-probs of the reference policy.
        response_mask: ``(bsz, resp_len)`` ``{0, 1}``.
        kl_ctrl: :class:`FixedKLController` or :class:`AdaptiveKLController` (updated in place).
        estimator: a name accepted by :func:`kl_penalty`.

    Returns:
        ``(token_level_rewards, metrics)``: rewards ``(bsz, resp_len)`` (equal to the scores outside the mask) and
        ``{"actor/reward_kl_penalty": batch KL, "actor/reward_kl_penalty_coeff": beta used}`` as floats.

    Raises:
        ValueError: for an unknown estimator.
    """
    mask = response_mask.to(token_level_scores.dtype)
    kld = kl_penalty(old_log_prob, ref_log_prob, estimator) * mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, response_mask, dim=-1).mean())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}
    return token_level_rewards, metrics
