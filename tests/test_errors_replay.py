"""docs/errors.md, "Rollout dumps and replays": every bad input of ``trainer.rollout_data_dir`` and
``trainer.load_rollout_data_dir`` (docs/replay.md) is one ``easyrl: <kind> error:`` line before Ray starts
(``load_config``, then ``easyrl.trainer.rollout_dump.check_dumps`` from ``build_trainer``), or at the step that
needs what is missing; and the warning of a replay that trains otherwise than the dumped run."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config import load_config
from easyrl.trainer.rollout_dump import RolloutDump, check_dumps, write_step

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def words(tiny_model_path, tmp_path):
    """``words(*overrides)``: the command-line words of the CPU demo with the tiny text model, runs under
    ``<tmp>/runs``, no validation data."""
    def build(*overrides):
        return [f"config={REPO / 'examples/configs/cpu_demo.yaml'}",
                f"worker.actor.model.model_path={tiny_model_path('qwen2_5')}", f"trainer.runs_root={tmp_path / 'runs'}",
                "data.val_files=null", *overrides]
    return build


def _config(argv):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config(argv)


def _batch() -> Batch:
    n = 16  # cpu_demo: 4 prompts x 4
    tensors = {"responses": torch.ones(n, 3, dtype=torch.long), "response_mask": torch.ones(n, 3, dtype=torch.long),
               "token_level_scores": torch.zeros(n, 3)}
    return Batch(TensorDict(tensors, batch_size=[n]), {"uid": [str(i // 4) for i in range(n)]})


@pytest.fixture
def dump(words, tmp_path):
    """The dump of a run ``cpu_demo`` (2 steps) in ``<tmp>/runs/easyrl/cpu_demo/rollouts``, steps 1 and 2."""
    folder = str(tmp_path / "runs" / "easyrl" / "cpu_demo" / "rollouts")
    config = _config(words(f"trainer.rollout_data_dir={folder}"))
    RolloutDump.create(config, 2, lambda: None)
    for step in (1, 2):
        write_step(folder, step, _batch())
    return folder


def _replay(words, folder, *overrides):
    return lambda: check_dumps(_config(words(f"trainer.load_rollout_data_dir={folder}",
                                             "trainer.experiment_name=replay", *overrides)), 0, 2)


@pytest.mark.parametrize("overrides, culprits", [
    pytest.param(["trainer.load_rollout_data_dir=/some/dump", "data.val_files=examples/data/geometry3k_sample"],
                 ["trainer.load_rollout_data_dir=/some/dump", "trainer.val_freq=2", "data.val_files=null"], id="P06"),
    pytest.param(["trainer.load_rollout_data_dir=/some/dump", "trainer.rollout_data_dir=/some/dump"],
                 ["trainer.rollout_data_dir and trainer.load_rollout_data_dir are the same folder"], id="P07"),
])
def test_replay_config_error(expect_user_error, words, overrides, culprits):
    expect_user_error(lambda: _config(words(*overrides)), "config", *culprits)


def test_a_replay_of_a_folder_that_does_not_exist(expect_user_error, words, tmp_path):  # P01
    expect_user_error(_replay(words, tmp_path / "nowhere"), "run",
                      f"trainer.load_rollout_data_dir={tmp_path / 'nowhere'} does not exist")


def test_a_replay_of_a_folder_that_is_no_dump(expect_user_error, words, tmp_path):  # P02
    write_step(str(tmp_path / "copied"), 1, _batch())  # step files without the dump's manifest
    expect_user_error(_replay(words, tmp_path / "copied"), "run", "is not a rollout dump (no dump.json)",
                      "it holds steps 1")


@pytest.mark.parametrize("overrides, culprits", [
    pytest.param(["data.max_response_length=32", "worker.rollout.n=2"],
                 ["data.max_response_length: 48 (dumped) -> 32", "worker.rollout.n: 4 (dumped) -> 2"], id="P03"),
    pytest.param(["worker.actor.model.model_path={llama}"], ["model_type=qwen2", "model_type=llama"], id="P03b"),
])
def test_a_replay_of_another_models_or_settings_samples(expect_user_error, words, dump, tiny_model_path,
                                                         overrides, culprits):
    overrides = [word.format(llama=tiny_model_path("llama")) for word in overrides]
    expect_user_error(_replay(words, dump, *overrides), "run", "holds samples of another model or other settings",
                      *culprits)


def test_a_replay_of_steps_the_dump_lacks(expect_user_error, words, dump):  # P04
    os.remove(os.path.join(dump, "step_000001.parquet"))  # pruned (trainer.rollout_data_limit=1)
    line = expect_user_error(_replay(words, dump), "run", "holds steps 2, but this run would replay steps 1-2",
                             "step 1 is not in the dump",
                             f"trainer.load_checkpoint_path={os.path.dirname(dump)}/global_step_1")
    assert "to replay from step 2" in line
    expect_user_error(lambda: check_dumps(_config(words(f"trainer.load_rollout_data_dir={dump}",
                                                        "trainer.experiment_name=replay", "trainer.max_steps=3")),
                                          1, 3), "run", "would replay steps 2-3", "step 3 is not")


def test_a_replay_into_the_dumped_runs_folder(expect_user_error, words, dump, tmp_path):  # P05
    expect_user_error(lambda: check_dumps(_config(words(f"trainer.load_rollout_data_dir={dump}")), 0, 2), "run",
                      "where this replay would write its own metrics, checkpoints and export over the dumped run's",
                      "trainer.experiment_name")
    elsewhere = f"trainer.save_checkpoint_path={tmp_path / 'checkpoints'}"  # the run folder is still the dumped one's
    expect_user_error(lambda: check_dumps(_config(words(f"trainer.load_rollout_data_dir={dump}", elsewhere)), 0, 2),
                      "run", f"was dumped by the run in {os.path.dirname(dump)}")
    into = f"trainer.save_checkpoint_path={os.path.dirname(dump)}"  # a run folder of its own, the dumped checkpoints
    expect_user_error(_replay(words, dump, into), "run", "over the dumped run's")


def test_an_r3_replay_of_a_dump_without_routing(expect_user_error, words, dump):  # P10
    r3 = "worker.actor.router_replay.mode=R3"
    expect_user_error(_replay(words, dump, r3), "run", "holds no routed_experts", "router_replay.mode=R2 or disabled")
    routed = _batch()
    routed["routed_experts"] = torch.full((len(routed), 3, 2, 1), -1, dtype=torch.int16)
    for step in (1, 2):
        write_step(dump, step, routed)
    _replay(words, dump, r3)()  # an R3 run's dump: replayed


def test_a_dump_into_another_runs_dump(expect_user_error, words, dump):  # P08
    expect_user_error(lambda: check_dumps(_config(words(f"trainer.rollout_data_dir={dump}",
                                                        "trainer.experiment_name=other")), 0, 2), "run",
                      f"trainer.rollout_data_dir={dump} holds the rollout dump of another run",
                      "runs/easyrl/cpu_demo")
    check_dumps(_config(words(f"trainer.rollout_data_dir={dump}")), 2, 4)  # the run itself, resumed: fine


def test_a_step_missing_when_it_is_replayed(expect_user_error, dump):  # P09
    from easyrl.trainer.batch_source import ReplayBatches

    expect_user_error(lambda: ReplayBatches(dump).next_batch(iter(()), 3, {}, {}), "run",
                      f"the rollout dump {dump} has no step 3 (step_000003.parquet); it holds steps 1-2")


def test_easyrl_rollouts_of_a_folder_that_is_no_dump(tmp_path, capsys, monkeypatch):  # X14
    from easyrl.cli import main

    monkeypatch.delenv("EASYRL_DEBUG", raising=False)
    assert main(["rollouts", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"easyrl: run error: the rollout dump {tmp_path / 'nowhere'} does not exist"), err
    assert "Traceback" not in err


def test_a_replay_that_trains_otherwise_is_logged(words, dump, caplog):  # W23
    with caplog.at_level(logging.WARNING, logger="easyrl.rollout_dump"):
        _replay(words, dump, "worker.actor.optim.lr=0.002")()
    lines = [r.getMessage() for r in caplog.records]
    assert any("other training settings than the dumped run's: worker.actor.optim.lr: 0.001 -> 0.002" in line
               for line in lines), lines
    _replay(words, dump)()  # the same settings: nothing logged
    assert len(caplog.records) == len(lines)
