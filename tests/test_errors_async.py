"""docs/errors.md, split placement (S..): what ``trainer.rollout_mode: one_step_off`` / ``async`` needs, each refused in
one ``easyrl: config error: ...`` line naming the key, before Ray (``easyrl.config.placement``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from easyrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
BASE = [f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m", "data.val_files=null"]
SPLIT = ["trainer.rollout_mode=one_step_off", "worker.rollout.n_gpus_per_node=1"]

CASES = [
    ("S01", ["trainer.rollout_mode=one_step_off"], ["trainer.rollout_mode=one_step_off",
                                                    "set worker.rollout.n_gpus_per_node"]),
    ("S02", ["worker.rollout.n_gpus_per_node=2"], ["worker.rollout.n_gpus_per_node=2",
                                                   "trainer.rollout_mode=one_step_off"]),
    ("S04", [*SPLIT, "worker.rollout.multi_turn.enable=true", "worker.rollout.multi_turn.patience=2",
             f"worker.rollout.multi_turn.tools=[{REPO / 'tests/agent_tools/tools.py'}:add]"],
     ["worker.rollout.multi_turn.patience=2", "set worker.rollout.multi_turn.patience=null"]),
    ("S07", ["trainer.rollout_mode=async", "worker.rollout.n_gpus_per_node=1", "data.rollout_batch_size=4",
             "data.mini_rollout_batch_size=3"],
     ["data.mini_rollout_batch_size=3 must divide", "trainer.rollout_mode=async"]),
    ("S08", [*SPLIT, "trainer.max_staleness=3"], ["trainer.max_staleness=3", "trainer.rollout_mode=async"]),
]


@pytest.mark.parametrize("cid, overrides, culprits", CASES, ids=[case[0] for case in CASES])
def test_split_config_error(expect_user_error, cid, overrides, culprits):
    expect_user_error(lambda: load_config([*BASE, *overrides]), "config", *culprits)

