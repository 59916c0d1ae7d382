"""Per-token KL estimators, KL-coefficient controllers and the in-reward KL penalty.

Estimators after J. Schulman, "Approximating KL Divergence" (2020, joschu.net/blog/kl-approx.html), with
``x = ref_logp - logp`` on samples of ``pi``: ``k1 = -x`` (unbiased, high variance), ``k2 = x^2 / 2`` (biased, low
variance), ``k3 = exp(x) - x - 1`` (unbiased, low variance, >= 0).
"""

from __future__ import annotations

import numpy as np
import torch

from easyrl.algorithms.masked_ops import masked_mean

__all__ = ["KL_ESTIMATORS", "KLController", "apply_kl_penalty", "kl_penalty", "make_kl_controller"]

_BASE_ESTIMATORS = ("kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3")
KL_ESTIMATORS = _BASE_ESTIMATORS + tuple(f"{name}+" for name in _BASE_ESTIMATORS)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref), ``(bsz, resp_len)``, unmasked, from the policy's and the reference's
    log-probs (nats) of the sampled tokens, both ``(bsz, resp_len)``. ``kl``/``k1``: ``logp - ref``; ``abs``:
    ``|logp - ref|``; ``mse``/``k2``: ``0.5 (logp - ref)^2``; ``low_var_kl``/``k3``: ``exp(ref - logp) - (ref - logp)
    - 1``, ``ref - logp`` clamped to [-20, 20] and the result to [-10, 10]. A trailing ``+`` (``"k3+"``) keeps the
    value but takes k2's gradient (straight-through), an unbiased estimate of grad KL(pi || pi_ref). ValueError for an
    unknown estimator, listing the valid names."""
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


class KLController:
    """The KL coefficient ``beta`` (``value``): constant, or with ``target_kl`` the proportional controller (Ziegler et
    al. 2019, arXiv:1909.08593, Sec. 2.2) ``beta <- beta * (1 + clip(KL / target_kl - 1, -0.2, 0.2) * n_steps /
    horizon)``, ``target_kl`` in nats per token and ``horizon`` in samples, both > 0 (else ValueError)."""

    def __init__(self, kl_coef: float, target_kl: float | None = None, horizon: float = 1.0):
        if target_kl is not None and not (target_kl > 0 and horizon > 0):
            raise ValueError(f"adaptive KL controller: target_kl and horizon must be > 0, got {target_kl}, {horizon}")
        self.value = float(kl_coef)
        self.target = None if target_kl is None else float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Steer an adaptive ``value`` by the last batch's KL and its number of samples."""
        if self.target is not None:
            error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
            self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(kl_type: str, kl_coef: float, kl_target: float, kl_horizon: float) -> KLController:
    """The controller for ``algorithm.kl_type`` ``"fixed"`` or ``"adaptive"`` (``kl_target``, ``kl_horizon`` used by
    the latter); ValueError for another type or a non-positive adaptive target / horizon."""
    if kl_type not in ("fixed", "adaptive"):
        raise ValueError(f"unknown algorithm.kl_type {kl_type!r}; valid: fixed, adaptive")
    return KLController(kl_coef, kl_target, kl_horizon) if kl_type == "adaptive" else KLController(kl_coef)


@torch.no_grad()
def apply_kl_penalty(token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
                     response_mask: torch.Tensor, kl_ctrl: KLController, estimator: str
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in reward (Ziegler et al. 2019, arXiv:1909.08593, Eq. 2): ``r_t = score_t - beta * kl_t`` on valid tokens,
    ``beta = kl_ctrl.value``; all tensors ``(bsz, resp_len)``. Then ``kl_ctrl`` is updated with the batch KL (mean
    over sequences of the token-mean) and ``n_steps = bsz``. Returns the rewards and ``actor/reward_kl_penalty``,
    ``actor/reward_kl_penalty_coeff`` (the beta used). ValueError for an unknown estimator."""
    mask = response_mask.to(token_level_scores.dtype)
    kld = kl_penalty(old_log_prob, ref_log_prob, estimator) * mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, response_mask, dim=-1).mean())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}
    return token_level_rewards, metrics
