"""``easyrl simulate`` on every launch script in examples/ (their overrides on config.yaml, the recipes' models from
examples/model_configs): each fits its documented devices and passes the device checks. Minutes per recipe on two
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


@pytest.mark.slow
@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: os.path.basename(p))
def test_recipe_simulates_and_fits(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(_overrides(path)) == 0
