"""User errors of run folders, checkpoints and reward functions that fail on a sample (docs/errors.md, ids K..):
each is one line ``easyrl: <kind> error: ...`` with exit status 2, checked through the CLI's handler."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from easyrl.trainer.checkpoint import TRAINER_STATE, commit_checkpoint
from easyrl.trainer.run_folder import check_run_folder

FAULTY = str(Path(__file__).parent / "reward_functions" / "faulty.py")


def _trainer(folder: Path, **kw) -> SimpleNamespace:
    values = dict(save_checkpoint_path=str(folder), load_checkpoint_path=None, find_last_checkpoint=True,
                  logger=["console", "jsonl"], run_dir=str(folder))
    values.update(kw)
    return SimpleNamespace(**values)


def _checkpoint(tmp: str) -> None:
    Path(tmp, TRAINER_STATE).write_text("state")


def test_new_run_in_a_folder_with_another_runs_metrics(tmp_path, expect_user_error):  # K01
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    expect_user_error(lambda: check_run_folder(_trainer(tmp_path)), "run", str(tmp_path / "metrics.jsonl"),
                      "trainer.experiment_name")


def test_not_resuming_a_folder_with_checkpoints(tmp_path, expect_user_error):  # K02
    commit_checkpoint(str(tmp_path), 1, _checkpoint)
    expect_user_error(lambda: check_run_folder(_trainer(tmp_path, find_last_checkpoint=False)), "run",
                      "checkpoint_tracker.json", "trainer.find_last_checkpoint=false")


def test_load_checkpoint_path_that_is_not_a_checkpoint(tmp_path, expect_user_error):  # K03
    path = str(tmp_path / "global_step_9")
    expect_user_error(lambda: check_run_folder(_trainer(tmp_path, load_checkpoint_path=path)), "run",
                      f"trainer.load_checkpoint_path={path}", TRAINER_STATE)


def test_reward_function_failing_on_a_sample_with_on_error_raise(expect_user_error):  # K04
    from easyrl.rewards.function import RewardFunction
    from easyrl.rewards.guard import GuardedReward

    guard = GuardedReward(RewardFunction(f"{FAULTY}:compute_score"), on_error="raise")
    inputs = [{"response": r, "response_length": 1, "ground_truth": "1"} for r in ("ok", "boom")]
    expect_user_error(lambda: guard(inputs, step=7), "reward", "step 7, sample 1", "'boom'", "on_error=zero")
