"""On-policy distillation: the teacher's per-token reverse KL on the student's own samples as a negative advantage.

Sources: GKD (Agarwal et al. 2024, arXiv:2306.13649, Sec. 3, on-policy fraction 1, reverse KL) and Thinking Machines
2025, "On-Policy Distillation" (the single-sample reverse KL ``log pi_student(y_t) - log pi_teacher(y_t)`` on the
sampled tokens as a per-token advantage, discount 0). The student's log-probs are the old log-probs, the teacher's
those of the same tokens at the same temperature, both ``(bsz, resp_len)``. Pure distillation is
``adv_estimator: on_policy_distill``; ``algorithm.distill_coef: c > 0`` mixes ``-c * reverse_kl`` into another
estimator's advantage (docs/distillation.md). With several teachers each sample's teacher log-probs are its data
source's teacher's (MOPD), and the reverse KL is also reported per teacher. Values are detached and 0 outside the
response mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from easyrl.algorithms.advantages import ADV_ESTIMATORS, AdvantageInputs
from easyrl.algorithms.masked_ops import masked_mean

__all__ = ["add_distillation", "on_policy_distill_advantage", "reverse_kl_metrics", "token_reverse_kl"]


@torch.no_grad()
def token_reverse_kl(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                     response_mask: torch.Tensor) -> torch.Tensor:
    """``log pi_student(y_t) - log pi_teacher(y_t)`` (nats; its expectation is the reverse KL, one token's value may
    be negative), ``(bsz, resp_len)``, 0 outside the mask. ValueError when the three shapes differ."""
    if student_log_probs.shape != teacher_log_probs.shape or student_log_probs.shape != response_mask.shape:
        raise ValueError("student_log_probs, teacher_log_probs and response_mask must all be (bsz, resp_len); got "
                         f"{tuple(student_log_probs.shape)}, {tuple(teacher_log_probs.shape)}, "
                         f"{tuple(response_mask.shape)}")
    mask = response_mask.to(student_log_probs.dtype)
    return (student_log_probs - teacher_log_probs.to(student_log_probs.dtype)) * mask


@ADV_ESTIMATORS.register("on_policy_distill", needs_teacher=True, uses_reward=False)
@torch.no_grad()
def on_policy_distill_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``A_t = -(log pi_student(y_t) - log pi_teacher(y_t))``, rewards unused, ``old_log_probs`` the student's;
    ``advantages`` equal ``returns``. ValueError without ``old_log_probs`` or ``teacher_log_probs``."""
    if inputs.old_log_probs is None or inputs.teacher_log_probs is None:
        raise ValueError("on_policy_distill needs old_log_probs (the student's) and teacher_log_probs")
    advantages = -token_reverse_kl(inputs.old_log_probs, inputs.teacher_log_probs, inputs.response_mask)
    return advantages, advantages.clone()


@torch.no_grad()
def add_distillation(advantages: torch.Tensor, reverse_kl: torch.Tensor, coef: float) -> torch.Tensor:
    """``A_t - coef * reverse_kl_t``, ``(bsz, resp_len)``; ``coef`` is ``algorithm.distill_coef``."""
    return advantages - coef * reverse_kl.to(advantages.dtype)


def reverse_kl_metrics(reverse_kl: torch.Tensor, response_mask: torch.Tensor,
                       teacher_index: Optional[torch.Tensor] = None, names: Sequence[str] = ()) -> dict[str, float]:
    """``distill/reverse_kl``: the mean reverse KL over the batch's response tokens (nats per token); with several
    teachers (``names`` in index order, ``teacher_index`` ``(bsz,)`` each sample's) also ``distill/reverse_kl/<name>``
    over each teacher's samples' tokens (absent for a teacher with no token this step)."""
    mask = response_mask.to(reverse_kl.dtype)
    metrics = {"distill/reverse_kl": masked_mean(reverse_kl, mask).item()}
    for index, name in enumerate(names if teacher_index is not None else ()):
        own = mask * (teacher_index == index).to(mask.dtype).unsqueeze(-1)
        if own.sum() > 0:
            metrics[f"distill/reverse_kl/{name}"] = masked_mean(reverse_kl, own).item()
    return metrics
