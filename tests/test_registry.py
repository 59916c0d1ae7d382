"""The name -> function registry behind ADV_ESTIMATORS and POLICY_LOSSES."""

import pytest

from easyrl.algorithms.advantages import ADV_ESTIMATORS
from easyrl.algorithms.policy_losses import POLICY_LOSSES
from easyrl.algorithms.registry import Registry


def test_register_get_contains_iterate():
    registry = Registry("widget")

    @registry.register("b")
    def b():
        return "b"

    @registry.register("a")
    def a():
        return "a"

    assert registry.get("a") is a and registry.get("b")() == "b"
    assert "a" in registry and "c" not in registry
    assert list(registry) == ["b", "a"]  # registration order
    assert registry.names() == ["a", "b"] and len(registry) == 2
    assert registry.register("a")(a) is a  # the same function again: a no-op


def test_taken_name_and_unknown_name_raise():
    registry = Registry("widget")
    registry.register("a")(lambda: 1)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        registry.register("a")(lambda: 2)
    with pytest.raises(ValueError, match=r"unknown widget 'z'; valid names: \['a'\]"):
        registry.get("z")


def test_algorithm_registries():
    assert list(ADV_ESTIMATORS)[:6] == ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                                        "remax", "grpo_passk"]
    assert "gae" in ADV_ESTIMATORS  # registered by easyrl.algorithms.critic when the package is imported
    # verl 0.9's, registered by advantage_variants / covariance_losses / off_policy_losses when the package is imported
    assert {"opo", "gpg", "gdpo", "optimal_token_baseline"} <= set(ADV_ESTIMATORS)
    assert list(POLICY_LOSSES)[:4] == ["vanilla", "gspo", "cispo", "sapo"]
    assert set(POLICY_LOSSES) == {"vanilla", "gspo", "cispo", "sapo", "clip_cov", "kl_cov", "geo_mean", "dppo_tv",
                                  "dppo_kl", "dro", "gpg", "bypass_mode", "gspo_token"}
