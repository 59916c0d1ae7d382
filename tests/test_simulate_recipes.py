"""``easyrl simulate`` on every launch script in examples/ (their overrides on config.yaml, the recipes' models from
easyrl/model_configs): each fits its documented devices and passes the device checks. Minutes per recipe on two
cores, so under the ``slow`` marker (``make test-slow``); the default suite simulates a small model
(tests/test_simulate.py)."""

from __future__ import annotations

import glob
import os

import pytest

from easyrl.simulate.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "examples", "*.sh")))


def _overrides(path: str) -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_configs", os.path.join(ROOT, "tests",
                                                                                  "test_example_configs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(path) as f:
        return module.script_overrides(f.read(), path)


CASES = SCRIPTS  # LoRA included: peft wraps the meta model outside the fake mode (phases.simulated_rank)


# the phases of the roles a recipe adds beside the actor (easyrl.simulate.phases), by recipe
ROLE_PHASES = {"qwen2_5_7b_math12k_grpo_reward_model.sh": ["load reward model", "reward model forward"],
               "qwen3_8b_to_1_7b_math12k_distill.sh": ["load teacher", "teacher forward"]}
HELD_BESIDE = {"qwen2_5_vl_7b_geo3k_judge.sh": "judge vLLM (worker.reward.judge.gpu_memory_utilization)"}


@pytest.mark.slow
@pytest.mark.parametrize("path", CASES, ids=lambda p: os.path.basename(p))
def test_recipe_simulates_and_fits(path, monkeypatch, capsys):
    import json

    monkeypatch.chdir(ROOT)
    code = main(_overrides(path) + ["--json"])
    out = json.loads(capsys.readouterr().out)
    peaks = " ".join(f"{p['name']}={p['peak_gib']:.1f}" for p in out["simulated"])
    print(f"\n{os.path.basename(path)}: estimate rollout {out['estimate']['rollout_gib']:.1f} training "
          f"{out['estimate']['training_gib']:.1f} GiB; simulated peaks: {peaks}")  # pytest -s: the table's numbers
    assert code == 0, out["problem"]
    phases = [p["name"] for p in out["simulated"]]
    for name in ROLE_PHASES.get(os.path.basename(path), []):
        assert name in phases, phases
    beside = HELD_BESIDE.get(os.path.basename(path))
    if beside:  # the judge's engine, resident beside every phase, and its weights within its claim
        assert out["judge"]["weights_gib"] < out["judge"]["claim_gib"]
        assert out["estimate"]["training"][beside] == pytest.approx(out["judge"]["claim_gib"])
