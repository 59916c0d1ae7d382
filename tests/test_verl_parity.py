"""easyrl's algorithms against verl 0.9.1's own functions (``verl.trainer.ppo.core_algos`` and ``rollout_corr_helper``):
every advantage estimator, policy loss, aggregation mode, KL estimator, value loss and rollout correction both
libraries have, on random float64 inputs (groups of 1, 2, 4 and 8 with tied and all-equal rewards, masks with holes,
several shapes): values and gradients within 1e-6. ``make setup`` installs verl without its dependencies into
``.cache/verl`` (``pip install --target .cache/verl --no-deps verl==0.9.1 codetiming``); the rest of what
``core_algos`` imports (omegaconf, tensordict, ray, transformers) is already in the environment. The deliberate
differences are in docs/algorithms.md ("Differences from verl")."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from easyrl.algorithms.advantages import ADV_ESTIMATORS, AdvantageInputs
from easyrl.algorithms.critic import compute_value_loss
from easyrl.algorithms.kl import KL_ESTIMATORS, kl_penalty
from easyrl.algorithms.loss_agg import LOSS_AGG_MODES, agg_loss
from easyrl.algorithms.policy_losses import POLICY_LOSSES, PolicyLossInputs, PolicyLossSettings
from easyrl.algorithms.rollout_correction import (
    ROLLOUT_RS_OPTIONS,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)
from easyrl.config import ActorConfig

VERL_DIR = Path(__file__).resolve().parents[1] / ".cache" / "verl"
if VERL_DIR.is_dir() and str(VERL_DIR) not in sys.path:
    sys.path.append(str(VERL_DIR))
try:
    import verl
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos as V
    from verl.trainer.ppo import rollout_corr_helper as VR
    from verl.workers.config import FSDPActorConfig
except ImportError as error:  # pragma: no cover - `make setup` installs it
    pytest.skip(f"verl 0.9.1 cannot be imported ({error}); `make setup` installs it into .cache/verl",
                allow_module_level=True)

D = torch.float64
TOL = dict(rtol=1e-6, atol=1e-6)

# What both libraries have; the test below asserts these are exactly the shared names, so a name added to either
# side shows up here.
SHARED_ESTIMATORS = ["gae", "gdpo", "gpg", "grpo", "grpo_passk", "opo", "optimal_token_baseline",
                     "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo"]
SHARED_LOSSES = ["bypass_mode", "cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "geo_mean", "gpg", "gspo",
                 "kl_cov", "sapo", "vanilla"]
SHARED_AGG_MODES = ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-mean",
                    "token-sum"]
VERL_AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]


def test_verl_is_0_9_1():
    assert verl.__version__ == "0.9.1"


def test_the_shared_names_are_all_covered():
    assert sorted(set(ADV_ESTIMATORS) & set(V.ADV_ESTIMATOR_REGISTRY)) == SHARED_ESTIMATORS
    assert sorted(set(POLICY_LOSSES) & set(V.POLICY_LOSS_REGISTRY)) == SHARED_LOSSES
    assert sorted(set(LOSS_AGG_MODES) & set(VERL_AGG_MODES)) == SHARED_AGG_MODES
    assert sorted(ROLLOUT_RS_OPTIONS) == sorted(VR.SUPPORTED_ROLLOUT_RS_OPTIONS)
    for name in KL_ESTIMATORS:  # every easyrl KL name is one verl accepts
        V.kl_penalty(torch.zeros(1), torch.zeros(1), name)


# ------------------------------------------------------------------------------------------------ random batches

GROUPINGS = [(1, 2, 4, 8), (8, 8), (2, 2, 2), (4, 1, 1)]
LENGTHS = [5, 9, 3, 12]


def _batch(case: int, holes: bool = True, empty_row: bool = False) -> dict:
    """Case ``case``: groups of the sizes in ``GROUPINGS[case]`` (scores from {0, 0.5, 1}: ties; the last group has
    all-equal scores), ``LENGTHS[case]`` response positions, left-aligned lengths with holes inside."""
    gen = torch.Generator().manual_seed(case)
    sizes, resp_len = GROUPINGS[case], LENGTHS[case]
    index = np.array([f"g{g}" for g, size in enumerate(sizes) for _ in range(size)], dtype=object)
    bsz = len(index)
    lengths = torch.randint(1, resp_len + 1, (bsz,), generator=gen)
    mask = (torch.arange(resp_len) < lengths.unsqueeze(-1)).to(D)
    if holes:
        hole = (torch.rand(bsz, resp_len, generator=gen) < 0.2) & (torch.arange(resp_len) > 0)
        mask = mask * (~hole).to(D)
    if empty_row:
        mask[1] = 0
    scores = torch.randint(0, 3, (bsz,), generator=gen).to(D) / 2
    scores[-sizes[-1]:] = scores[-1]  # the last group: all equal
    last = torch.where(mask.bool(), torch.arange(resp_len), -1).amax(-1).clamp(min=0)
    rewards = torch.zeros(bsz, resp_len, dtype=D)
    rewards[torch.arange(bsz), last] = scores * mask[torch.arange(bsz), last]
    old = -3 * torch.rand(bsz, resp_len, generator=gen, dtype=D)
    return dict(
        index=index, mask=mask, rewards=rewards, resp_len=resp_len,
        dense_rewards=torch.randn(bsz, resp_len, generator=gen, dtype=D) * mask,
        values=torch.randn(bsz, resp_len, generator=gen, dtype=D),
        baselines=torch.rand(bsz, generator=gen, dtype=D),
        components=torch.randint(0, 3, (bsz, 2), generator=gen).to(D) / 2,
        advantages=3 * torch.randn(bsz, resp_len, generator=gen, dtype=D) * mask,
        old_log_prob=old,
        log_prob=old + 0.3 * torch.randn(bsz, resp_len, generator=gen, dtype=D),
        rollout_log_prob=old + 0.2 * torch.randn(bsz, resp_len, generator=gen, dtype=D),
        sum_pi_squared=torch.rand(bsz, resp_len, generator=gen, dtype=D) * torch.exp(old) ** 2 + 0.1,
        ref_log_prob=old + 0.5 * torch.randn(bsz, resp_len, generator=gen, dtype=D),
    )


CASES = range(len(GROUPINGS))

# ---------------------------------------------------------------------------------------------------- estimators


def _verl_estimator(name: str, b: dict, norm: bool):
    fn = V.get_adv_estimator_fn(name)
    common = dict(token_level_rewards=b["rewards"].clone(), response_mask=b["mask"])
    if name == "gae":
        return fn(token_level_rewards=b["dense_rewards"], values=b["values"], response_mask=b["mask"], gamma=0.9,
                  lam=0.8)
    if name == "reinforce_plus_plus":
        return fn(token_level_rewards=b["dense_rewards"], response_mask=b["mask"], config=AlgoConfig(gamma=0.9))
    if name == "remax":
        return fn(**common, reward_baselines=b["baselines"])
    if name == "optimal_token_baseline":
        return fn(**common, index=b["index"], old_log_probs=b["old_log_prob"], sum_pi_squared=b["sum_pi_squared"],
                  rollout_is_weights=torch.exp(b["old_log_prob"] - b["rollout_log_prob"]).clamp(max=2.0))
    return fn(**common, index=b["index"], norm_adv_by_std_in_grpo=norm,
              config=AlgoConfig(norm_adv_by_std_in_grpo=norm))


def _easyrl_estimator(name: str, b: dict, norm: bool):
    rewards = b["dense_rewards"] if name in ("gae", "reinforce_plus_plus") else b["rewards"]
    return ADV_ESTIMATORS.get(name)(AdvantageInputs(
        rewards, b["mask"], b["index"], gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=norm,
        reward_baselines=b["baselines"], values=b["values"] if name == "gae" else None,
        old_log_probs=b["old_log_prob"], sum_pi_squared=b["sum_pi_squared"],
        rollout_is_weights=torch.exp(b["old_log_prob"] - b["rollout_log_prob"]).clamp(max=2.0)))


@pytest.mark.parametrize("name", SHARED_ESTIMATORS)
def test_advantage_estimators_match_verl(name):
    for case in CASES:
        if name == "grpo_passk" and min(GROUPINGS[case]) < 2:
            continue  # verl and easyrl both refuse groups of one
        for norm in (True, False):
            # optimal_token_baseline: a response ends past its last trained token in easyrl (multi-turn tool turns
            # are holes inside the mask, #22), at mask.sum() in verl; the two agree on masks without holes
            b = _batch(case, holes=name != "optimal_token_baseline")
            expected = _verl_estimator(name, b, norm)
            got = _easyrl_estimator(name, b, norm)
            for e, g in zip(expected, got):
                torch.testing.assert_close((g * b["mask"]).to(D), (e * b["mask"]).to(D), **TOL)


def test_gdpo_with_reward_components_matches_verl():
    b = _batch(0, holes=False)
    prompt = torch.ones(len(b["index"]), 3, dtype=torch.long)
    keys = {"format": b["components"][:, 0].numpy(), "accuracy": b["components"][:, 1].numpy()}
    config = AlgoConfig(gdpo_reward_keys=list(keys), gdpo_reward_weights=[1, .5])
    expected, _ = V.compute_gdpo_outcome_advantage(
        b["rewards"], b["mask"], b["index"], config=config,
        non_tensor_batch=keys, batch={"prompts": prompt, "attention_mask": torch.cat([prompt, b["mask"].long()], 1)})
    got, _ = ADV_ESTIMATORS.get("gdpo")(AdvantageInputs(b["rewards"], b["mask"], b["index"],
                                                         reward_components=b["components"], reward_weights=(1, .5)))
    torch.testing.assert_close(got, expected.to(D), rtol=1e-5, atol=1e-5)  # verl casts the components to float32


# ------------------------------------------------------------------------------------------------ aggregation


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", SHARED_AGG_MODES)
def test_agg_loss_matches_verl(mode, case):
    b = _batch(case, empty_row=True)
    loss_mat = b["advantages"].clone().requires_grad_()
    tokens, seqs = int(b["mask"].sum()) + 7, int(b["mask"].any(-1).sum()) + 2  # as if other micro-batches existed
    got = agg_loss(loss_mat, b["mask"], mode, global_num_tokens=tokens, global_num_seqs=seqs, dp_size=2,
                   norm_length=20)
    expected = V.agg_loss(loss_mat, b["mask"], mode, dp_size=2, batch_num_tokens=tokens, global_batch_size=seqs,
                          loss_scale_factor=20)
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(torch.autograd.grad(got, loss_mat)[0], torch.autograd.grad(expected, loss_mat)[0],
                               **TOL)


# ---------------------------------------------------------------------------------------------------- KL, value


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_kl_estimators_match_verl(estimator):
    b = _batch(0)
    logp = b["log_prob"].clone().requires_grad_()
    got, expected = kl_penalty(logp, b["ref_log_prob"], estimator), V.kl_penalty(logp, b["ref_log_prob"], estimator)
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), logp)[0], torch.autograd.grad(expected.sum(), logp)[0],
                               **TOL)


@pytest.mark.parametrize("mode", SHARED_AGG_MODES)
def test_value_loss_matches_verl(mode):
    b = _batch(2)
    vpreds = (b["values"] + 0.4 * b["advantages"]).requires_grad_()
    got, metrics = compute_value_loss(vpreds, b["dense_rewards"], b["values"], b["mask"], cliprange_value=0.5,
                                      loss_agg_mode=mode)
    expected, clipfrac = V.compute_value_loss(vpreds, b["dense_rewards"], b["values"], b["mask"], 0.5, mode)
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(torch.autograd.grad(got, vpreds)[0], torch.autograd.grad(expected, vpreds)[0], **TOL)


# ----------------------------------------------------------------------------------------------- policy losses

LOSS_MODES = {  # the aggregation each loss is compared under (verl's sapo forces seq-mean-token-mean)
    "sapo": ["seq-mean-token-mean"],
    "geo_mean": ["token-mean"],  # geo_mean has its own (sequence-mean) aggregation in both
}
BYPASS = [dict(bypass_loss_type="ppo_clip", rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25"),
          dict(bypass_loss_type="reinforce", rollout_is="sequence", rollout_is_threshold=1.5),
          dict(bypass_loss_type="reinforce", rollout_is="token", rollout_is_threshold=1.3,
               rollout_is_threshold_lower=0.7, rollout_rs="seq_max_k2,seq_mean_k3", rollout_rs_threshold="0.5,0.08")]


def _settings(mode: str, **extra) -> tuple[PolicyLossSettings, FSDPActorConfig]:
    # clip_cov: a wide covariance band and ratio so that several tokens are detached; kl_cov: several penalised
    ours = PolicyLossSettings.of(ActorConfig(
        loss_agg_mode=mode, clip_ratio_low=0.15, clip_ratio_high=0.25, clip_ratio_dual=3.0, tau_positive=1.0,
        tau_negative=1.05, clip_cov_ratio=0.1, clip_cov_lb=-2.0, clip_cov_ub=2.0, kl_cov_ratio=0.1, ppo_kl_coef=0.3,
        dro_beta=0.7, **extra))
    theirs = FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.15,
                             clip_ratio_high=0.25, clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05)
    policy_loss = theirs.policy_loss
    for key in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta"):
        object.__setattr__(policy_loss, key, getattr(ours, key))
    correction = policy_loss.rollout_correction
    threshold = ours.rollout_is_threshold if ours.rollout_is_threshold_lower is None else (
        f"{ours.rollout_is_threshold_lower}_{ours.rollout_is_threshold}")
    for key, value in dict(loss_type=ours.bypass_loss_type, rollout_is=ours.rollout_is, rollout_is_threshold=threshold,
                           rollout_rs=ours.rollout_rs, rollout_rs_threshold=ours.rollout_rs_threshold).items():
        object.__setattr__(correction, key, value)
    return ours, theirs


def _loss_cases():
    for name in SHARED_LOSSES:
        for mode in LOSS_MODES.get(name, SHARED_AGG_MODES):
            for extra in (BYPASS if name == "bypass_mode" else [{}]):
                yield pytest.param(name, mode, extra, id=f"{name}-{mode}-{extra.get('bypass_loss_type', '')}"
                                   f"{extra.get('rollout_is', '')}")


@pytest.mark.parametrize("name, mode, extra", list(_loss_cases()))
def test_policy_losses_match_verl(name, mode, extra):
    for case in CASES:
        for with_is in (False, True):
            _check_policy_loss(name, mode, extra, with_is, _batch(case, empty_row=name != "geo_mean" and case == 0))


def _check_policy_loss(name, mode, extra, with_is, b):
    ours, theirs = _settings(mode, **extra)
    old = b["rollout_log_prob"] if name == "bypass_mode" else b["old_log_prob"]
    weights = torch.exp(b["old_log_prob"] - b["rollout_log_prob"]).clamp(max=2.0) * b["mask"] if with_is else None
    logp = b["log_prob"].clone().requires_grad_()
    torch.manual_seed(1)  # clip_cov draws its tokens with torch.randperm
    got, _ = POLICY_LOSSES.get(name)(PolicyLossInputs(old, logp, b["advantages"], b["mask"],
                                                      rollout_is_weights=weights), ours)
    torch.manual_seed(1)
    expected, _ = V.get_policy_loss_fn(name)(old, logp, b["advantages"], b["mask"], loss_agg_mode=mode,
                                             config=theirs, rollout_is_weights=weights)
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(torch.autograd.grad(got, logp)[0], torch.autograd.grad(expected, logp)[0], **TOL)


# ------------------------------------------------------------------------------------------ rollout correction


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("level, upper, lower", [("token", 2.0, None), ("sequence", 2.0, None), ("token", 1.3, 0.7),
                                                 ("sequence", 1.5, 0.5)])
def test_rollout_is_weights_match_verl(level, upper, lower, case):
    b = _batch(case)
    log_ratio = b["old_log_prob"] - b["rollout_log_prob"]
    got, metrics = compute_rollout_correction_weights(log_ratio, b["mask"], level, upper, lower)
    spec = upper if lower is None else f"{lower}_{upper}"
    expected, verl_metrics = VR.compute_rollout_correction_weights(log_ratio, b["mask"], level, spec)
    torch.testing.assert_close(got, expected, **TOL)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(verl_metrics["rollout_is_mean"], abs=1e-6)


@pytest.mark.parametrize("options, threshold", [(option, "0.8_1.25" if option.endswith("k1") else 0.05)
                                                for option in sorted(ROLLOUT_RS_OPTIONS)]
                         + [("token_k1,seq_max_k3,seq_sum_k1", "0.7_1.4,0.1,0.2_3.0"), ("seq_mean_k1", 1.1)])
def test_rejection_masks_match_verl(options, threshold):
    for case in CASES:
        b = _batch(case)
        log_ratio = b["old_log_prob"] - b["rollout_log_prob"]
        got, metrics = compute_rollout_rejection_mask(log_ratio, b["mask"], options, threshold)
        expected, verl_metrics = VR.compute_rollout_rejection_mask(log_ratio, b["mask"], options, threshold)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(
            verl_metrics["rollout_rs_masked_fraction"], abs=1e-6)
