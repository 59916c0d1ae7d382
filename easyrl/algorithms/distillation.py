"""On-policy distillation: the teacher's per-token reverse KL on the student's own samples as a (negative) advantage.

Sources:

* Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes" (GKD,
  ICLR 2024, arXiv:2306.13649): the student is trained on sequences it samples itself (Sec. 3, Eq. 2-4, the
  on-policy fraction ``lambda = 1``), with the divergence between teacher and student token distributions as the
  loss; the reverse KL ``D_KL(pi_student || pi_teacher)`` is the mode-seeking end of their generalized JSD
  (``beta = 1`` in TRL's ``GKDTrainer``).
* Thinking Machines Lab 2025, "On-Policy Distillation" (Lu et al., thinkingmachines.ai/blog/on-policy-distillation):
  the reverse KL is estimated on the sampled tokens only, ``log pi_student(y_t | x, y_<t) - log pi_teacher(y_t | x,
  y_<t)``, and its negative is used as a per-token advantage with discount 0 (each token is judged by the teacher
  alone, no return over later tokens), optimised with the usual policy-gradient loss (importance-sampled against
  the sampling policy).

Here the student's log-probs are the old (pre-update) log-probs of the sampled tokens, ``(bsz, resp_len)``, computed
by the actor; the teacher's are its log-probs of the same tokens at the same temperature, ``(bsz, resp_len)``.
Two ways to use it (``algorithm``):

* pure distillation, ``adv_estimator: on_policy_distill``: ``A_t = -(log pi_student - log pi_teacher)``, the reward
  unused (Thinking Machines' setting);
* mixed with RL, ``distill_coef: c > 0`` with any other estimator: ``A_t = A_t^RL - c * (log pi_student -
  log pi_teacher)``, as slime's ``--opd-kl-coef``.

The per-token values are detached (they are advantages, not a differentiable loss) and 0 outside the response mask.
"""

from __future__ import annotations

import torch

from easyrl.algorithms.advantages import ADV_ESTIMATORS, AdvantageInputs
from easyrl.algorithms.masked_ops import masked_mean

__all__ = ["add_distillation", "on_policy_distill_advantage", "reverse_kl_metrics", "token_reverse_kl"]


@torch.no_grad()
def token_reverse_kl(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                     response_mask: torch.Tensor) -> torch.Tensor:
    """The single-sample reverse-KL estimate of each sampled token, ``log pi_student(y_t) - log pi_teacher(y_t)``.

    Its expectation under the student's sampling is ``D_KL(pi_student || pi_teacher)`` at that position (Thinking
    Machines 2025); a single token's value may be negative.

    Args:
        student_log_probs: ``(bsz, resp_len)`` the student's log-probs of its sampled tokens (nats).
        teacher_log_probs: ``(bsz, resp_len)`` the teacher's log-probs of the same tokens (nats).
        response_mask: ``(bsz, resp_len)`` ``{0, 1}``, 1 on generated tokens.

    Returns:
        ``(bsz, resp_len)`` float, 0 outside ``response_mask``.

    Raises:
        ValueError: the three shapes differ.
    """
    if student_log_probs.shape != teacher_log_probs.shape or student_log_probs.shape != response_mask.shape:
        raise ValueError("student_log_probs, teacher_log_probs and response_mask must all be (bsz, resp_len); got "
                         f"{tuple(student_log_probs.shape)}, {tuple(teacher_log_probs.shape)}, "
                         f"{tuple(response_mask.shape)}")
    mask = response_mask.to(student_log_probs.dtype)
    return (student_log_probs - teacher_log_probs.to(student_log_probs.dtype)) * mask


@ADV_ESTIMATORS.register("on_policy_distill", needs_teacher=True, uses_reward=False)
@torch.no_grad()
def on_policy_distill_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure on-policy distillation (Thinking Machines 2025; GKD with ``lambda = 1`` and the reverse KL, Agarwal et al.
    2024): ``A_t = -(log pi_student(y_t) - log pi_teacher(y_t))`` on every response token, discount 0; the rewards
    are not used; ``old_log_probs`` are the student's. ``advantages`` and ``returns`` are equal.

    Raises:
        ValueError: ``old_log_probs`` or ``teacher_log_probs`` is missing.
    """
    if inputs.old_log_probs is None or inputs.teacher_log_probs is None:
        raise ValueError("on_policy_distill needs old_log_probs (the student's) and teacher_log_probs")
    advantages = -token_reverse_kl(inputs.old_log_probs, inputs.teacher_log_probs, inputs.response_mask)
    return advantages, advantages.clone()


@torch.no_grad()
def add_distillation(advantages: torch.Tensor, reverse_kl: torch.Tensor, coef: float) -> torch.Tensor:
    """RL mixed with distillation: ``A_t - coef * reverse_kl_t``, all ``(bsz, resp_len)`` and 0 outside the mask
    (``reverse_kl``: :func:`token_reverse_kl`; ``coef``: ``algorithm.distill_coef`` >= 0)."""
    return advantages - coef * reverse_kl.to(advantages.dtype)


def reverse_kl_metrics(reverse_kl: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """``distill/reverse_kl``: the mean of :func:`token_reverse_kl` ``(bsz, resp_len)`` over the batch's response
    tokens (nats per token)."""
    return {"distill/reverse_kl": masked_mean(reverse_kl, response_mask.to(reverse_kl.dtype)).item()}
