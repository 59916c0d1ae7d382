"""Checkpoint bookkeeping without Ray or models: atomic commits, the tracker, retention, an interrupted save, the
resumable prompt stream, per-sample seeds, the metrics file, signals and the non-finite gradient rule."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from easyrl.errors import RunStateError
from easyrl.trainer.checkpoint import (
    TRAINER_STATE,
    checkpoints_to_delete,
    commit_checkpoint,
    find_last_checkpoint,
    read_tracker,
)

REPO = Path(__file__).resolve().parents[1]


def _write(tmp: str) -> None:
    Path(tmp, "shard").write_text("weights")
    Path(tmp, TRAINER_STATE).write_text("state")


def test_tracker_names_last_and_best_and_limit_keeps_an_old_best(tmp_path):
    root = str(tmp_path)
    values = {1: 0.5, 2: 0.9, 3: 0.1, 4: None, 5: 0.3}  # step 2 is the best, and older than the newest 2
    for step, value in values.items():
        commit_checkpoint(root, step, _write, metric=value, metric_name="val/reward/overall", save_limit=2)
    tracker = read_tracker(root)
    assert tracker["last_global_step"] == 5
    assert (tracker["best_global_step"], tracker["best_metric_value"]) == (2, 0.9)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_2", "global_step_4", "global_step_5"]
    assert find_last_checkpoint(root) == os.path.join(root, "global_step_5")


def test_retention_rule():
    assert checkpoints_to_delete([1, 2, 3, 4], newest=4, limit=2, best=None) == [1, 2]
    assert checkpoints_to_delete([1, 2, 3, 4], newest=4, limit=2, best=1) == [2]
    assert checkpoints_to_delete([1, 2, 3, 4], newest=4, limit=2, best=4) == [1, 2]
    assert checkpoints_to_delete([1, 2, 3, 4], newest=4, limit=-1, best=None) == []
    assert checkpoints_to_delete([1, 2], newest=2, limit=1, best=None) == [1]


def test_min_mode_ranks_lower_as_better(tmp_path):
    for step, value in ((1, 2.0), (2, 1.0), (3, 3.0)):
        commit_checkpoint(str(tmp_path), step, _write, metric=value, metric_name="loss", mode="min")
    assert read_tracker(str(tmp_path))["best_global_step"] == 2


SAVE_THEN_HANG = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from easyrl.trainer.checkpoint import commit_checkpoint

    def write(tmp):
        Path(tmp, "shard_0").write_text("half of the weights")
        Path(sys.argv[2]).write_text("writing")  # tell the test we are half-way
        time.sleep(600)

    commit_checkpoint(sys.argv[1], 2, write)
""")


def test_a_save_killed_half_way_leaves_the_previous_checkpoint_as_the_last(tmp_path):
    root = tmp_path / "ckpt"
    commit_checkpoint(str(root), 1, _write)
    flag = tmp_path / "flag"
    proc = subprocess.Popen([sys.executable, "-c", SAVE_THEN_HANG, str(root), str(flag)], cwd=REPO)
    deadline = time.time() + 60
    while not flag.exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (root / ".global_step_2.tmp" / "shard_0").exists()  # the half-written save is there, under its temp name
    assert find_last_checkpoint(str(root)) == str(root / "global_step_1")
    assert not (root / "global_step_2").exists()
    commit_checkpoint(str(root), 2, _write)  # the resumed run saves step 2 again: the leftover is replaced
    assert find_last_checkpoint(str(root)) == str(root / "global_step_2")
    assert not (root / ".global_step_2.tmp").exists()


def test_a_tracker_write_that_fails_half_way_leaves_the_previous_tracker(tmp_path, monkeypatch):
    """The tracker is written to a temporary file and then renamed over the old one: a write cut short (here the
    disk fills after 12 bytes) leaves the old tracker whole. Written in place, it would be left as '{"last_glob'."""
    import errno

    import easyrl.trainer.checkpoint as checkpoint

    root = str(tmp_path)
    commit_checkpoint(root, 1, _write)

    def dump_until_full(data, f, **kwargs):
        f.write(json.dumps(data)[:12])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.json, "dump", dump_until_full)
    with pytest.raises(RunStateError, match="last good checkpoint is .*global_step_1"):
        commit_checkpoint(root, 2, _write)
    monkeypatch.undo()
    assert read_tracker(root)["last_global_step"] == 1
    assert find_last_checkpoint(root) == os.path.join(root, "global_step_1")
    commit_checkpoint(root, 2, _write)  # the same save again, with space: the stale step-2 folder is replaced
    assert find_last_checkpoint(root) == os.path.join(root, "global_step_2")


def test_missing_checkpoint_named_by_the_tracker_is_an_error(tmp_path):
    (tmp_path / "checkpoint_tracker.json").write_text(json.dumps({"last_global_step": 3}))
    with pytest.raises(RunStateError, match="global_step_3"):  # a user error: one line, status 2 in every command
        find_last_checkpoint(str(tmp_path))


def test_run_folder_refusals(tmp_path):
    from types import SimpleNamespace

    from easyrl.trainer.loggers import JsonlLogger
    from easyrl.trainer.run_folder import check_run_folder, checkpoint_to_resume

    trainer = SimpleNamespace(save_checkpoint_path=str(tmp_path), load_checkpoint_path=None,
                              find_last_checkpoint=True, logger=["jsonl"], run_dir=str(tmp_path))
    check_run_folder(trainer)  # empty folder: a new run
    logger = JsonlLogger(str(tmp_path / "metrics.jsonl"))
    logger.log({"a": 1.0}, step=1)
    logger.close()
    with pytest.raises(RunStateError, match="metrics of another run"):
        check_run_folder(trainer)
    with pytest.raises(RunStateError, match="metrics of another run"):
        JsonlLogger(str(tmp_path / "metrics.jsonl"))
    commit_checkpoint(str(tmp_path), 1, _write)
    assert checkpoint_to_resume(trainer) == str(tmp_path / "global_step_1")
    check_run_folder(trainer)  # resuming: allowed
    resumed = JsonlLogger(str(tmp_path / "metrics.jsonl"), resume=True)
    resumed.log({"a": 2.0}, step=2)
    resumed.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # appended, never truncated
    trainer.find_last_checkpoint = False
    with pytest.raises(RunStateError, match="checkpoints of an earlier run"):
        checkpoint_to_resume(trainer)
    trainer.load_checkpoint_path = str(tmp_path / "nowhere")
    with pytest.raises(RunStateError, match="not a complete checkpoint"):
        checkpoint_to_resume(trainer)


@pytest.mark.parametrize("stop_after", [1, 2, 3, 5, 7])
def test_prompt_stream_resumes_the_same_batches_across_epochs(stop_after):
    from easyrl.data.loader import PromptStream

    data = list(range(10))  # 3 batches of 3 per epoch; the 10th item is dropped

    def collate(items):
        return list(items)

    reference = PromptStream(data, 3, shuffle=True, seed=1, collate_fn=collate)
    stream = iter(reference)
    expected = [next(stream) for _ in range(9)]
    assert expected[0:3] != expected[3:6]  # reshuffled each epoch
    first = PromptStream(data, 3, shuffle=True, seed=1, collate_fn=collate)
    stream = iter(first)
    for _ in range(stop_after):
        next(stream)
    state = first.state_dict()
    resumed = PromptStream(data, 3, shuffle=True, seed=1, collate_fn=collate)
    resumed.load_state_dict(state)
    stream = iter(resumed)
    assert [next(stream) for _ in range(9 - stop_after)] == expected[stop_after:]


def test_sample_seeds_depend_on_seed_step_round_index_and_phase():
    from easyrl.trainer.seeding import batch_seeds, sample_seed

    seeds = batch_seeds(1, 3, 8)
    assert seeds == batch_seeds(1, 3, 8) and len(set(seeds)) == 8
    assert all(0 <= s < 2**31 for s in seeds)
    others = {sample_seed(2, 3, 0), sample_seed(1, 4, 0), sample_seed(1, 3, 0, round_=1), sample_seed(1, 3, 0, 0, "val")}
    assert seeds[0] not in others and len(others) == 4
    with pytest.raises(ValueError):
        sample_seed(1, 1, 0, phase="nope")


def test_nonfinite_gradient_norm_skips_then_stops():
    from easyrl.workers.trainable import NonFiniteGradientError, skip_nonfinite_step

    assert skip_nonfinite_step(0.5, consecutive=0, limit=3) is False
    assert skip_nonfinite_step(float("nan"), consecutive=0, limit=3) is True
    assert skip_nonfinite_step(float("inf"), consecutive=1, limit=3) is True
    with pytest.raises(NonFiniteGradientError, match="3 optimizer steps in a row"):
        skip_nonfinite_step(float("nan"), consecutive=2, limit=3)
    assert skip_nonfinite_step(float("nan"), consecutive=100, limit=0) is True  # no limit


TWO_SIGNALS = textwrap.dedent("""
    import os, signal, sys, time
    from easyrl.trainer.launch import GracefulStop

    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("requested", stop.requested, stop.signum == signal.SIGTERM, flush=True)
        if sys.argv[1] == "twice":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            print("not reached", flush=True)
    print("restored", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
""")


def test_first_signal_asks_to_stop_second_exits_at_once():
    once = subprocess.run([sys.executable, "-c", TWO_SIGNALS, "once"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert once.returncode == 0 and "requested True True" in once.stdout and "restored True" in once.stdout
    twice = subprocess.run([sys.executable, "-c", TWO_SIGNALS, "twice"], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
    assert twice.returncode == 128 + signal.SIGINT and "not reached" not in twice.stdout


def test_checkpointer_writes_a_manifest_and_refuses_a_mismatch_before_the_workers_load(tmp_path):
    """``Checkpointer.save`` writes ``manifest.json`` after every shard; ``load`` checks it before any worker reads."""
    from types import SimpleNamespace

    from easyrl.trainer.checkpoint import Checkpointer
    from easyrl.trainer.checkpoint import MANIFEST

    class Workers:
        calls: list[str] = []

        def run_all(self, method, path):
            self.calls.append(method.__name__)
            if method.__name__ == "save_checkpoint":
                Path(path, "actor").mkdir()
                Path(path, "actor", "__0_0.distcp").write_bytes(b"w" * 64)

    identity = {"world_size": 2, "optimizer": "AdamW", "actor_lora_rank": 0, "critic": False, "model": {}}
    trainer = SimpleNamespace(save_checkpoint_path=str(tmp_path), save_limit=-1, best_metric="val/reward/overall",
                              best_metric_mode="max")
    workers = Workers()
    path = Checkpointer(trainer, workers, identity).save(4, {"global_step": 4})
    manifest = json.loads(Path(path, MANIFEST).read_text())
    assert manifest["world_size"] == 2 and manifest["files"]["actor/__0_0.distcp"] == 64
    assert TRAINER_STATE in manifest["files"]
    assert Checkpointer(trainer, workers, identity).load(path)["global_step"] == 4
    workers.calls.clear()
    with pytest.raises(RunStateError, match="this run has 4"):
        Checkpointer(trainer, workers, {**identity, "world_size": 4}).load(path)
    assert workers.calls == []  # refused before any worker was asked to load
