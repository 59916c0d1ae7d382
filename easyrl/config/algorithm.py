"""``algorithm:``: the RL algorithm (advantage estimator, KL regularisation, dynamic sampling, the rollout-correction
bypass mode), and the checks of the bypass mode against the other sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from easyrl.config.fields import NON_NEGATIVE, POSITIVE, POSITIVE_OR_OFF, UNIT, Note, registered
from easyrl.errors import ConfigError


@dataclass
class AlgorithmConfig:
    """The RL algorithm: advantage estimator and KL regularisation."""

    adv_estimator: Annotated[str, registered("easyrl.algorithms.advantages", "ADV_ESTIMATORS")] = "grpo"
    """The advantage estimator (docs/algorithms.md); what it needs (a critic, a teacher, groups) is its registry
    entry's traits (:meth:`estimator`)."""
    norm_adv_by_std_in_grpo: bool = True
    """False gives Dr.GRPO (no division by the group's std)."""
    gamma: Annotated[float, UNIT] = 1.0
    """Discount per token (GAE and REINFORCE++)."""
    lam: Annotated[float, UNIT] = 1.0
    """GAE's lambda (``adv_estimator: gae``): 1 = Monte-Carlo return minus the value, 0 = one-step TD error."""
    disable_kl: bool = False
    """Skip the reference model entirely (no ref forward, no ref memory)."""
    use_kl_loss: bool = True
    """KL as a loss term of the actor; ``use_kl_in_reward`` puts it in the reward instead."""
    use_kl_in_reward: bool = False
    kl_penalty: Annotated[str, registered("easyrl.algorithms.kl", "KL_ESTIMATORS")] = "low_var_kl"
    """KL estimator: kl (k1), abs, mse (k2), low_var_kl (k3)."""
    kl_coef: Annotated[float, NON_NEGATIVE] = 1e-2
    kl_type: Literal["fixed", "adaptive"] = "fixed"
    """Controller of the in-reward KL coefficient: fixed or adaptive."""
    kl_target: Annotated[float, POSITIVE] = 0.1
    kl_horizon: Annotated[float, POSITIVE] = 10000.0
    online_filtering: bool = False
    """DAPO dynamic sampling: drop groups whose ``filter_key`` scores are all equal or whose mean lies outside
    [``filter_low``, ``filter_high``], and keep generating until ``data.rollout_batch_size`` groups are kept."""
    filter_key: str = "overall"
    """The reward name that online filtering looks at (``overall``, ``accuracy``, ...)."""
    filter_low: Annotated[float, UNIT] = 0.01
    filter_high: Annotated[float, UNIT] = 0.99
    max_try_make_batch: Annotated[int, POSITIVE_OR_OFF] = 20
    """Generation rounds per step at most when filtering; then the step fails with a clear error (-1: no limit)."""
    bypass_mode: bool = False
    """verl's rollout-correction bypass mode (``algorithm.rollout_correction.bypass_mode`` there): vLLM's sampled-token
    log-probs (``rollout_log_probs``) are the old policy's, ``old_log_probs = rollout_log_probs``, and the trainer's
    old-log-prob pass (``timing_s/old_log_prob``) does not run; nor do the ``rollout/*`` mismatch metrics and the
    weight-sync check, which compare the two. Needs ``worker.rollout.calculate_log_probs`` and vLLM sampling the
    distribution the actor scores (top_p 1, top_k off, temperature > 0). Colocated it equals the recompute up to
    numerics; split or async the old policy becomes the (older) behaviour policy (docs/algorithms.md, "Bypass
    mode")."""
    distill_coef: Annotated[float, NON_NEGATIVE, Note("0 turns distillation off")] = 0.0
    """On-policy distillation mixed with RL (docs/distillation.md): the per-token reverse
    KL to the teacher (``worker.teacher``), ``log pi_student(y_t) - log pi_teacher(y_t)``, times this coefficient is
    subtracted from the RL advantage of every response token. 0 = off. Pure distillation (no reward in the advantage)
    is ``adv_estimator: on_policy_distill`` with this left at 0."""

    def check(self) -> None:
        """Raises ``ConfigError`` for KL both as a loss and in the reward, ``filter_low`` above ``filter_high``, or an
        estimator that needs what the actor does not compute yet."""
        if self.use_kl_loss and self.use_kl_in_reward:
            raise ConfigError("algorithm.use_kl_loss and algorithm.use_kl_in_reward are both true: choose one.")
        if self.filter_low > self.filter_high:
            raise ConfigError(f"algorithm.filter_low ({self.filter_low}) is larger than algorithm.filter_high "
                              f"({self.filter_high}).")
        if self.estimator("needs_sum_pi_squared"):
            raise ConfigError(f"algorithm.adv_estimator={self.adv_estimator} needs sum_v pi(v)^2 at every response "
                              "token, which easyrl's actor does not compute yet; choose another estimator (grpo, opo).")

    def estimator(self, trait: str) -> Any:
        """``trait`` of the estimator ``adv_estimator`` names (``group``, ``needs_critic``, ``needs_teacher``,
        ``uses_reward``, ...: see ``easyrl.algorithms.advantages.ADV_ESTIMATORS``)."""
        from easyrl.algorithms.advantages import ADV_ESTIMATORS

        return ADV_ESTIMATORS.trait(self.adv_estimator, trait)

    @property
    def needs_reference(self) -> bool:
        """Whether a KL term (loss or in-reward) uses the reference policy; otherwise none is built or run."""
        return not self.disable_kl and (self.use_kl_loss or self.use_kl_in_reward)

    @property
    def needs_teacher(self) -> bool:
        """Whether the run distills from a teacher (``distill_coef > 0`` or an estimator that reads the teacher's
        log-probs, ``on_policy_distill``); otherwise none is built or run."""
        return self.distill_coef > 0 or self.estimator("needs_teacher")

    @property
    def needs_critic(self) -> bool:
        """Whether the estimator needs a learned value model (``gae``); otherwise no critic is built or run."""
        return self.estimator("needs_critic")


def check_bypass_mode(config: Any) -> None:
    """``algorithm.bypass_mode`` of a finalized ``PPOConfig`` where it can apply and is right: vLLM's log-probs are
    kept (``worker.rollout.calculate_log_probs``), they are of the distribution the actor scores (no
    ``PPOConfig.sampling_mismatches``: with top-p/top-k truncation or another temperature the ratio's denominator
    would be another distribution's), and no decoupled correction (``worker.actor.tis_cap``, ``rollout_is``,
    ``rollout_rs``) is left that would compare the old log-probs with themselves (weights 1, nothing rejected) unless
    ``worker.actor.loss_type: bypass_mode`` computes it against the current policy inside the loss. Raises
    ``ConfigError`` naming the key and what to set. Source: verl 0.9.1's rollout correction (its guide
    docs/algo/rollout_corr.md, "Bypass mode"; verl itself checks none of these but the log-probs' presence)."""
    if not config.algorithm.bypass_mode:
        return
    key = "algorithm.bypass_mode=true"
    if not config.worker.rollout.calculate_log_probs:
        raise ConfigError(f"{key} takes vLLM's sampled-token log-probs as the old policy's, but "
                          "worker.rollout.calculate_log_probs=false does not keep them: set "
                          "worker.rollout.calculate_log_probs=true, or algorithm.bypass_mode=false (the actor "
                          "recomputes the old log-probs).")
    mismatches = config.sampling_mismatches
    if mismatches:
        raise ConfigError(f"{key} needs vLLM's log-probs of the distribution the actor scores, but "
                          f"with {'; '.join(mismatches)} they are another distribution's, and every ratio pi_theta / "
                          "pi_old would be biased: set worker.rollout.top_p=1.0, top_k=-1 and a temperature > 0, or "
                          "algorithm.bypass_mode=false (the actor recomputes the old log-probs).")
    actor = config.worker.actor
    from easyrl.algorithms.policy_losses import POLICY_LOSSES

    if POLICY_LOSSES.trait(actor.loss_type, "uses_engine_log_probs"):
        return  # the loss computes rollout_is / rollout_rs against the current policy (verl's bypass losses)
    corrections = [name for name, value in (("tis_cap", actor.tis_cap), ("rollout_is", actor.rollout_is),
                                            ("rollout_rs", actor.rollout_rs)) if value is not None]
    if corrections:
        names = ", ".join(f"worker.actor.{name}" for name in corrections)
        raise ConfigError(f"{key} makes vLLM's log-probs the old ones, so {names} would compare them with themselves "
                          "(every weight 1, nothing rejected): set worker.actor.loss_type=bypass_mode to apply them "
                          "against the current policy inside the loss (verl's bypass mode), or "
                          "algorithm.bypass_mode=false to correct pi_old against pi_rollout (decoupled mode).")
