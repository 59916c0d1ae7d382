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


# ----------------------------------------------------------------------- checkpoint faults (K10..K16)
IDENTITY = {"world_size": 2, "optimizer": "AdamW", "actor_lora_rank": 0, "critic": False,
            "model": {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 2, "vocab_size": 1000}}


def _full_checkpoint(identity: dict):
    """A writer of a checkpoint with the files a real one has (DCP metadata and a shard, each rank's extra state, the
    driver's state) and its manifest, written last as ``Checkpointer.save`` does."""
    from easyrl.trainer.checkpoint import write_manifest

    def write(tmp: str) -> None:
        Path(tmp, "actor").mkdir()
        Path(tmp, "actor", ".metadata").write_bytes(b"m" * 50)
        Path(tmp, "actor", "__0_0.distcp").write_bytes(b"w" * 1000)
        for rank in range(identity["world_size"]):
            Path(tmp, f"extra_state_rank_{rank}.pt").write_bytes(b"e" * 10)
        Path(tmp, TRAINER_STATE).write_text("state")
        write_manifest(tmp, identity)

    return write


def _resume(folder: Path, identity: dict):
    from easyrl.trainer.checkpoint import check_checkpoint
    from easyrl.trainer.run_folder import checkpoint_to_resume

    return lambda: check_checkpoint(checkpoint_to_resume(_trainer(folder)), identity)


def test_truncated_checkpoint_shard_is_refused_naming_the_file(tmp_path, expect_user_error):  # K10
    commit_checkpoint(str(tmp_path), 3, _full_checkpoint(IDENTITY))
    shard = tmp_path / "global_step_3" / "actor" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:400])  # a copy cut short, a disk that filled after the rename
    expect_user_error(_resume(tmp_path, IDENTITY), "run", str(shard), "400 of its 1000 bytes",
                      "trainer.load_checkpoint_path")


def test_half_deleted_checkpoint_is_refused_naming_the_missing_file(tmp_path, expect_user_error):  # K11
    commit_checkpoint(str(tmp_path), 3, _full_checkpoint(IDENTITY))
    gone = tmp_path / "global_step_3" / "extra_state_rank_1.pt"
    gone.unlink()
    expect_user_error(_resume(tmp_path, IDENTITY), "run", str(gone), "is missing", "incomplete")


def test_checkpoint_of_another_model_is_refused(tmp_path, expect_user_error):  # K12
    commit_checkpoint(str(tmp_path), 3, _full_checkpoint(IDENTITY))
    other = {**IDENTITY, "model": {**IDENTITY["model"], "hidden_size": 896}}
    expect_user_error(_resume(tmp_path, other), "run", str(tmp_path / "global_step_3" / "manifest.json"),
                      "hidden_size=256", "hidden_size=896", "worker.actor.model.model_path")


def test_checkpoint_of_another_world_size_is_refused(tmp_path, expect_user_error):  # K13
    commit_checkpoint(str(tmp_path), 3, _full_checkpoint(IDENTITY))
    expect_user_error(_resume(tmp_path, {**IDENTITY, "world_size": 4}), "run", "global_step_3",
                      "ranks (trainer.nnodes * trainer.n_gpus_per_node) = 2, this run has 4")


def test_checkpoint_of_another_optimizer_is_refused(tmp_path, expect_user_error):  # K14
    commit_checkpoint(str(tmp_path), 3, _full_checkpoint({**IDENTITY, "optimizer": "SGD", "actor_lora_rank": 8}))
    line = expect_user_error(_resume(tmp_path, IDENTITY), "run", "global_step_3", "optimizer = SGD, this run has AdamW")
    assert "worker.actor.model.lora.rank" in line and "= 8, this run has 0" in line


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(tmp_path, expect_user_error):  # K15
    import errno

    from easyrl.trainer.checkpoint import find_last_checkpoint, read_tracker

    commit_checkpoint(str(tmp_path), 5, _full_checkpoint(IDENTITY))

    def full_disk(tmp: str) -> None:
        Path(tmp, "actor").mkdir()
        Path(tmp, "actor", "__0_0.distcp").write_bytes(b"w" * 300)
        raise OSError(errno.ENOSPC, "No space left on device")

    expect_user_error(lambda: commit_checkpoint(str(tmp_path), 10, full_disk), "run", "global_step_10",
                      "No space left on device", f"last good checkpoint is {tmp_path / 'global_step_5'}",
                      "Free disk space")
    assert read_tracker(str(tmp_path))["last_global_step"] == 5
    assert find_last_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_5")
    assert not (tmp_path / ".global_step_10.tmp").exists() and not (tmp_path / "global_step_10").exists()


def test_a_real_config_refuses_a_checkpoint_of_other_ranks(tmp_path, e2e_text_config, expect_user_error):  # K16
    """``check_resumable`` (called before Ray starts) with the identity of a real config and model folder."""
    from easyrl.trainer.checkpoint import run_identity
    from easyrl.trainer.run_folder import check_resumable

    config = e2e_text_config(tmp_path)
    identity = run_identity(config)
    assert identity["world_size"] == 2 and identity["model"]["model_type"] == "qwen2"
    commit_checkpoint(config.trainer.save_checkpoint_path, 2, _full_checkpoint({**identity, "world_size": 1}))
    check_resumable(e2e_text_config(tmp_path, "trainer.n_gpus_per_node=1", "worker.actor.global_batch_size=2"))
    expect_user_error(lambda: check_resumable(config), "run", "global_step_2", "= 1, this run has 2")


def test_broken_weight_sync(expect_user_error):  # K06
    from easyrl.workers.weight_sync import check_weight_sync

    check_weight_sync(0.1, 0.1)  # at the bound: goes on
    check_weight_sync(5.0, None)  # off
    expect_user_error(lambda: check_weight_sync(0.25, 0.1), "sync", "rollout/log_prob_diff_median = 0.25",
                      "worker.actor.rollout_sync_threshold = 0.1", "w13_weight")
