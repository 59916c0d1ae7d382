"""Pure-tensor RL algorithms: advantage estimators, KL penalties, policy losses, token log-probs.

Nothing here knows about models, workers or distributed groups; every function maps tensors to
tensors and is unit-tested against hand-computed values (see ``tests/test_*.py``).

Modules:
    registry            ``Registry``: name -> function, behind ``ADV_ESTIMATORS`` and ``POLICY_LOSSES``
    masked_ops          masked sum / mean / variance / whitening
    advantages          advantage estimators ``fn(AdvantageInputs)``, registry ``ADV_ESTIMATORS``
                        (``algorithm.adv_estimator``), ``compute_advantage``
    kl                  KL estimators k1/k2/k3, KL controllers, in-reward KL penalty
    loss_agg            loss aggregation (``agg_loss``, ``loss_agg_mode``) with global normalisation
    policy_losses       policy losses ``fn(PolicyLossInputs, PolicyLossSettings)``, registry ``POLICY_LOSSES``
                        (``worker.actor.loss_type``)
    covariance_losses   Clip-Cov and KL-Cov (entropy-collapse control), registered in ``POLICY_LOSSES``
    off_policy_losses   GPG, DRO, GMPO, DPPO and bypass mode, registered in ``POLICY_LOSSES``
    advantage_variants  OPO, GPG, GDPO and the optimal token baseline, registered in ``ADV_ESTIMATORS``
    rollout_correction  importance weights (token/sequence TIS, IcePop) and rejection sampling (rollout engine vs
                        trainer)
    token_ops           log-probs and entropy from logits (memory-frugal)
    dynamic_sampling    DAPO group filtering
    critic              GAE (registered as the estimator "gae") and the clipped value loss
    distillation        on-policy distillation: the teacher's per-token reverse KL as an advantage (registered as
                        the estimator "on_policy_distill"), mixed into another estimator's by a coefficient
"""

from easyrl.algorithms import advantage_variants as _advantage_variants  # noqa: F401  (registers estimators)
from easyrl.algorithms import covariance_losses as _covariance_losses  # noqa: F401  (registers losses)
from easyrl.algorithms import critic as _critic  # noqa: F401  (registers the "gae" advantage estimator)
from easyrl.algorithms import distillation as _distillation  # noqa: F401  (registers "on_policy_distill")
from easyrl.algorithms import off_policy_losses as _off_policy_losses  # noqa: F401  (registers losses)
