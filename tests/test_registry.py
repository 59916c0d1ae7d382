"""The name -> function registry behind ADV_ESTIMATORS and POLICY_LOSSES."""

import ast
from pathlib import Path

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
    assert registry.names() == ["a", "b"]
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


def test_traits_defaults_and_unknown_trait():
    registry = Registry("widget", group=False)
    registry.register("a", group=True)(lambda: 1)
    registry.register("b")(lambda: 2)
    assert registry.trait("a", "group") and not registry.trait("b", "group")
    assert registry.trait("unknown", "group") is False  # read before the name is checked: the default
    with pytest.raises(ValueError, match=r"widget 'c': unknown traits \['grup'\]; known: \['group'\]"):
        registry.register("c", grup=True)


def test_estimator_and_loss_traits():
    group = {name for name in ADV_ESTIMATORS if ADV_ESTIMATORS.trait(name, "group")}
    assert group == {"grpo", "rloo", "reinforce_plus_plus_baseline", "remax", "grpo_passk", "opo", "gpg", "gdpo",
                     "optimal_token_baseline"}
    assert [n for n in ADV_ESTIMATORS if ADV_ESTIMATORS.trait(n, "needs_critic")] == ["gae"]
    assert [n for n in ADV_ESTIMATORS if not ADV_ESTIMATORS.trait(n, "uses_reward")] == ["on_policy_distill"]
    assert [n for n in POLICY_LOSSES if POLICY_LOSSES.trait(n, "uses_engine_log_probs")] == ["bypass_mode"]


def _registry_names_compared(path: Path, names: set[str]) -> list[str]:
    """``file:line`` of every comparison (``==``, ``!=``, ``in``) with a string literal that names a registry entry,
    and of every module-level tuple/list/set of such names (a list to test membership in, like GROUP_ESTIMATORS)."""
    tree = ast.parse(path.read_text())

    def literals(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and literals(node) & names:
            found.append(f"{path}:{node.lineno}")
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List, ast.Set)) \
                and literals(node.value) & names:
            found.append(f"{path}:{node.lineno}")
    return found


def test_no_estimator_or_loss_name_compared_outside_algorithms():
    """What an estimator or loss *is* (group-relative, needs a critic, reads the engine's log-probs, ...) is a trait on
    its registry entry; the config checks, the trainer and the workers read it instead of comparing names."""
    names = set(ADV_ESTIMATORS) | set(POLICY_LOSSES)
    package = Path(__file__).resolve().parents[1] / "easyrl"
    found = [hit for path in sorted(package.rglob("*.py")) if "algorithms" not in path.relative_to(package).parts
             for hit in _registry_names_compared(path, names)]
    assert not found, f"estimator/loss names compared as strings (read a trait instead): {found}"


@pytest.mark.parametrize("estimator", ["opo", "gpg", "gdpo", "grpo", "remax"])
def test_greedy_sampling_is_refused_with_every_group_estimator(estimator):
    """Greedy sampling with ``n > 1`` makes a group's samples identical and every group-relative advantage 0."""
    from easyrl.config import load_config
    from easyrl.errors import ConfigError

    repo = Path(__file__).resolve().parents[1]
    with pytest.raises(ConfigError, match=rf"samples greedily.*algorithm.adv_estimator={estimator} "):
        load_config([f"config={repo / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m",
                     "worker.rollout.temperature=0", f"algorithm.adv_estimator={estimator}"])
