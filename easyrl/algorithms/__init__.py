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
    rollout_correction  truncated importance-sampling weights (rollout engine vs trainer)
    token_ops           log-probs and entropy from logits (memory-frugal)
    dynamic_sampling    DAPO group filtering
    critic              GAE (registered as the estimator "gae") and the clipped value loss
"""

from easyrl.algorithms import critic as _critic  # noqa: F401  (registers the "gae" advantage estimator)
