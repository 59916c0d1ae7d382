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
    ("S09", ["trainer.rollout_mode=one_step_off", "trainer.n_gpus_per_node=1", "worker.rollout.n_gpus_per_node=2",
             "worker.rollout.tensor_parallel_size=4"],
     ["worker.rollout.tensor_parallel_size=4 must divide worker.rollout.n_gpus_per_node=2"]),
]


@pytest.mark.parametrize("cid, overrides, culprits", CASES, ids=[case[0] for case in CASES])
def test_split_config_error(expect_user_error, cid, overrides, culprits):
    expect_user_error(lambda: load_config([*BASE, *overrides]), "config", *culprits)



def test_split_engines_are_counted_on_their_own_devices():  # S09
    """The rules of the split engines count the rollout devices, not the trainer's (were: refused by C55, C93 and
    warned of by W15, each counting trainer.n_gpus_per_node)."""
    import warnings

    from easyrl.config.checks import ConfigWarning

    fits = [["trainer.rollout_mode=one_step_off", "trainer.n_gpus_per_node=1", "worker.rollout.n_gpus_per_node=2",
             "worker.rollout.tensor_parallel_size=2"],  # an engine of 2 rollout devices beside 1 trainer device
            ["trainer.rollout_mode=async", "trainer.n_gpus_per_node=4", "worker.rollout.n_gpus_per_node=1",
             "data.mini_rollout_batch_size=1", "worker.rollout.n=2",
             "worker.actor.micro_batch_size_per_device_for_update=1"],  # a round of 2 samples: the stream spreads it
            ["trainer.rollout_mode=one_step_off", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
             "worker.rollout.n_gpus_per_node=2", "worker.rollout.tensor_parallel_size=2"]]  # engines within a node
    for words in fits:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConfigWarning)
            load_config([*BASE, *words])
