"""``algorithm:``: the RL algorithm (advantage estimator, KL regularisation, dynamic sampling)."""

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
