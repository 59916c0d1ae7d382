"""Pure-tensor RL algorithms (no models, workers or process groups): advantage estimators (``ADV_ESTIMATORS``:
advantages, advantage_variants, critic, distillation), policy losses (``POLICY_LOSSES``: policy_losses,
covariance_losses, off_policy_losses), loss_agg, kl, rollout_correction, token_ops, dynamic_sampling, masked_ops.
"""

from easyrl.algorithms import advantage_variants as _advantage_variants  # noqa: F401  (registers estimators)
from easyrl.algorithms import covariance_losses as _covariance_losses  # noqa: F401  (registers losses)
from easyrl.algorithms import critic as _critic  # noqa: F401  (registers the "gae" advantage estimator)
from easyrl.algorithms import distillation as _distillation  # noqa: F401  (registers "on_policy_distill")
from easyrl.algorithms import off_policy_losses as _off_policy_losses  # noqa: F401  (registers losses)
