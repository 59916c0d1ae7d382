"""End to end: a run killed from outside resumes exactly; checkpoints export to Hugging Face; faults stop cleanly.

One tiny text model (Qwen2.5 classes, 2 CPU ranks), 10 prompts in batches of 4 (2 steps per epoch), 5 steps, a
checkpoint every step, validation every 2 steps:

- run A, in this process, uninterrupted: the reference metrics, the actor's log-probs of a fixed sequence, then a
  worker is killed to show that the trainer stops at once, naming the rank and the last good checkpoint;
- run B, ``python -m easyrl.trainer``, SIGKILLed (process group) as soon as its tracker names step 2 (seen from
  outside, while the run is inside step 3): the resume starts at an epoch boundary;
- run C, the same command: resumes, gets SIGTERM once its tracker names step 3, saves after the step it is in and
  exits with 143;
- run D, the same command: resumes and finishes (its progress bar starts at the resumed step). Every step logged
  after a resume equals run A's, except the metrics measured from the machine (the clock and memory:
  ``easyrl.trainer.metrics.MEASURED_PREFIXES``, e.g. ``timing_s/*``, ``perf/throughput``, ``perf/mfu/*``,
  ``perf/cpu_memory_used_gb``). Run D is a fixture of its own (``finished``), under ``make test-slow`` only (one
  trainer start-up fewer in ``make test``, whose runs A to C check the resume after both signals).

Then a checkpoint of run A is exported with ``python -m easyrl.export`` and loaded in transformers and in vLLM.

Run E, ``trainer.rollout_mode=async`` (one trainer rank, one engine generating ahead), one epoch of the 10 prompts in
batches of 2, SIGKILLed (process group) once its tracker names step 2 and run again to the end: each prompt is trained
once over the epoch (issue #46: nothing generated ahead of the checkpoint is lost or trained twice).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from easyrl.workers.fsdp_worker import FSDPWorker

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = (
    "worker.rollout.limit_images=0", "trainer.total_epochs=3", "trainer.max_steps=5", "trainer.save_freq=1",
    "trainer.save_limit=2", "trainer.val_freq=2", "data.max_response_length=24",
)
LOGPROB_TOL = 2e-3  # vLLM's CPU kernels vs the FSDP2 forward, both float32 (see test_e2e_grpo.py)


def _rows(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl by step; a step logged twice (before a kill and after the resume) keeps its later row."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


def _comparable(row: dict) -> dict:
    """The row without the wall-clock and memory measurements (the only metrics a resume may change)."""
    from easyrl.trainer.metrics import MEASURED_PREFIXES

    return {k: v for k, v in row.items() if not k.startswith(MEASURED_PREFIXES)}


def _tracker_step(root: Path) -> int:
    try:
        return json.loads((root / "checkpoint_tracker.json").read_text()).get("last_global_step", 0)
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run_until(args: list[str], root: Path, step: int, sig: signal.Signals, group: bool, log: Path,
               timeout: float = 400) -> tuple[int, str]:
    """Start the trainer CLI in its own process group, wait until its tracker names ``step`` (polled from outside,
    every 0.2 s), then send ``sig`` to the group (``group``) or to the trainer process only. Returns the exit status
    and the log."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "easyrl.trainer", *args], cwd=REPO, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    try:
        while _tracker_step(root) < step:
            if proc.poll() is not None:
                pytest.fail(f"the run ended before step {step}: {log.read_text()[-3000:]}")
            if time.time() > deadline:
                pytest.fail(f"no checkpoint of step {step} within {timeout} s")
            time.sleep(0.2)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        proc.wait(timeout=300)
    finally:
        _kill_group(proc.pid)  # whatever the run left behind (Ray's processes)
    return proc.returncode, log.read_text()


def _fixed_batch(trainer, response: list[int]):
    """Two copies (one per rank) of the first training prompt followed by ``response``, as the actor sees them."""
    from tensordict import TensorDict

    from easyrl.batch import Batch

    prompt = next(iter(trainer.train_dataloader))["prompt_ids"][0]
    length = trainer.config.data.max_prompt_length
    ids = torch.full((2, length), trainer.pad_id)
    ids[:, length - len(prompt):] = torch.tensor(prompt)
    mask = (torch.arange(length) >= length - len(prompt)).long().expand(2, -1)
    resp = torch.tensor(response).expand(2, -1)
    tensors = TensorDict({"prompts": ids, "responses": resp, "response_mask": torch.ones_like(resp),
                          "input_ids": torch.cat([ids, resp], 1),
                          "attention_mask": torch.cat([mask, torch.ones_like(resp)], 1)}, batch_size=[2])
    return Batch(tensors, {}), prompt


@pytest.fixture(scope="module")
def runs(e2e_args, local_ray, tmp_path_factory):
    """Run A in this process, then B and C as commands; returns what the tests compare."""
    import ray

    from easyrl.config import load_config
    from easyrl.trainer.__main__ import build_trainer

    root = tmp_path_factory.mktemp("resume")
    out: dict = {"root": root}
    local_ray()
    try:
        config = load_config(e2e_args("qwen2_5", root / "a", *OVERRIDES,
                                      f"trainer.rollout_data_dir={root / 'a' / 'rollouts'}"))  # every step dumped
        trainer = build_trainer(config)
        trainer.fit()
        out["a_dir"] = Path(config.trainer.run_dir)
        response = trainer.tokenizer.encode(" The answer is \\boxed{80}.", add_special_tokens=False)
        batch, prompt = _fixed_batch(trainer, response)
        out["actor_log_probs"] = torch.cat(trainer.workers.run_split(FSDPWorker.compute_log_probs, batch))[0].tolist()
        out["sequence"] = (prompt, response)
        out["model_path"] = config.worker.actor.model.model_path
        # a worker dies: the next call that needs it (rank 0 then waits in a collective) must stop the trainer
        ray.kill(trainer.workers.workers[1], no_restart=True)
        trainer.training_steps += 1
        start = time.perf_counter()
        with pytest.raises(RuntimeError) as err:
            trainer.fit()
        out["dead_worker"] = (str(err.value), time.perf_counter() - start, trainer.last_checkpoint)
        trainer.close()
        # a replay of run A's step 5 from its checkpoint of step 4, without engines (issue #53)
        replay = load_config(e2e_args("qwen2_5", root / "replay", *OVERRIDES, "data.val_files=null",
                                      f"trainer.load_rollout_data_dir={root / 'a' / 'rollouts'}",
                                      f"trainer.load_checkpoint_path={out['a_dir'] / 'global_step_4'}"))
        replayer = build_trainer(replay)
        replayer.fit()
        out["replay"] = (Path(replay.trainer.run_dir), type(replayer.placement).__name__,
                         replayer.workers.startup_seconds)
        replayer.close()
    finally:
        ray.shutdown()

    args = e2e_args("qwen2_5", root / "b", *OVERRIDES)
    b_dir = root / "b" / "easyrl" / "cpu_demo"
    out["b_dir"], out["args"] = b_dir, args
    _run_until(args, b_dir, 2, signal.SIGKILL, group=True, log=root / "b.log")
    out["killed_at"] = _tracker_step(b_dir)
    out["c_exit"], out["c_log"] = _run_until(args, b_dir, out["killed_at"] + 1, signal.SIGTERM, group=False,
                                             log=root / "c.log")
    out["stopped_at"] = _tracker_step(b_dir)
    return out


ASYNC = ("trainer.rollout_mode=async", "trainer.n_gpus_per_node=1", "worker.rollout.n_gpus_per_node=1",
         "trainer.max_staleness=2", "data.rollout_batch_size=2", "data.mini_rollout_batch_size=1",
         "trainer.total_epochs=1", "trainer.max_steps=5", "trainer.save_freq=1", "data.val_files=null",
         "worker.rollout.limit_images=0",
         "data.max_response_length=24")


@pytest.fixture(scope="module")
def async_killed(e2e_args, tmp_path_factory) -> dict:
    """Run E: async, SIGKILLed after its checkpoint of step 2, then the same command to the end (5 steps)."""
    root = tmp_path_factory.mktemp("async_resume")
    run_dir = root / "easyrl" / "cpu_demo"
    args = e2e_args("qwen2_5", root, *ASYNC, f"trainer.rollout_data_dir={run_dir / 'rollouts'}")
    _run_until(args, run_dir, 2, signal.SIGKILL, group=True, log=root / "e.log")
    killed_at = _tracker_step(run_dir)
    done = subprocess.run([sys.executable, "-m", "easyrl.trainer", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=400, start_new_session=True)
    return {"run_dir": run_dir, "killed_at": killed_at, "done": done}


def test_an_async_run_killed_mid_epoch_trains_each_prompt_once(async_killed):  # issue #46
    """Run E: the epoch's 5 steps of 2 prompts, across the SIGKILL and the resume, train the 10 prompts once each
    (each step's problems read from its rollout dump)."""
    from easyrl.trainer.rollout_dump import read_step

    done, run_dir = async_killed["done"], async_killed["run_dir"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert 2 <= async_killed["killed_at"] < 5 and sorted(_rows(run_dir)) == [1, 2, 3, 4, 5]
    steps = []  # each step's problems by their row id (prompt texts repeat in the sample: "Find x.")
    for step in range(1, 6):
        steps.append({columns["id"] for columns in read_step(str(run_dir / "rollouts"), step)["columns"]})
    print("ASYNC resume: prompts per step", [len(s) for s in steps], "killed after step", async_killed["killed_at"])
    assert [len(s) for s in steps] == [2] * 5
    assert len(set().union(*steps)) == 10  # none trained twice, none lost


@pytest.fixture(scope="module")
def finished(runs) -> str:
    """Run D: the command once more, which resumes from run C's checkpoint and finishes; its console."""
    done = subprocess.run([sys.executable, "-m", "easyrl.trainer", *runs["args"]], cwd=REPO, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def _logged_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_killed_and_stopped_run_resumes_exactly(runs):
    """Runs B and C: every step up to the one C stopped after equals run A's."""
    a, b, stopped = _rows(runs["a_dir"]), _rows(runs["b_dir"]), runs["stopped_at"]
    assert sorted(a) == [1, 2, 3, 4, 5] and set(range(1, stopped + 1)) <= set(b)
    assert 2 <= runs["killed_at"] < 5 and runs["killed_at"] < stopped < 5
    assert runs["c_exit"] == 128 + signal.SIGTERM, runs["c_log"][-3000:]
    for step in range(1, stopped + 1):
        assert _comparable(b[step]) == _comparable(a[step]), step
        assert b[step]["timing_s/step"] > 0
    assert "val/reward/overall" in a[4] and a[3]["critic/advantages/max"] > 0  # the comparison covers real training
    assert len(_comparable(a[5])) > 40 and "perf/total_num_tokens" in _comparable(a[5])
    # resumes appended: the killed run's rows are still there
    steps = _logged_steps(runs["b_dir"])
    assert steps[:runs["killed_at"]] == list(range(1, runs["killed_at"] + 1)) and len(steps) >= stopped


@pytest.mark.slow  # `make test-slow` only (the suite's time): one trainer start-up (~90 s on 2 cores)
def test_the_stopped_run_finishes_like_the_uninterrupted_one(runs, finished):
    """Run D: the steps after C's stop equal run A's too; its progress bar starts at the step it resumed from, and
    its summary lines follow."""
    a, b, stopped = _rows(runs["a_dir"]), _rows(runs["b_dir"]), runs["stopped_at"]
    assert sorted(b) == [1, 2, 3, 4, 5]
    for step in range(stopped + 1, 6):
        assert _comparable(b[step]) == _comparable(a[step]), step
        assert b[step]["timing_s/step"] > 0
    assert f"| {stopped}/5 [" in finished and "| 0/5 [" not in finished, finished[-3000:]
    assert f"step {stopped + 1}/5 | reward" in finished and "step 5/5 | reward" in finished
    steps = _logged_steps(runs["b_dir"])
    assert steps[:runs["killed_at"]] == list(range(1, runs["killed_at"] + 1)) and len(steps) >= 5


def test_tracker_retention_and_best(runs):
    from easyrl.trainer.checkpoint import read_tracker

    a_dir = runs["a_dir"]
    tracker = read_tracker(str(a_dir))
    rows = _rows(a_dir)
    best = max((2, 4, 5), key=lambda s: rows[s]["val/reward/overall"])  # validated at 2, 4 and the last step
    assert tracker["last_global_step"] == 5 and tracker["best_global_step"] == best
    assert tracker["best_metric_value"] == rows[best]["val/reward/overall"]
    kept = sorted(p.name for p in a_dir.glob("global_step_*"))
    assert kept == sorted({f"global_step_{s}" for s in (4, 5, best)})  # save_limit=2, plus the best
    assert not list(a_dir.glob(".global_step_*"))


def test_a_dumped_step_replays_without_engines_to_the_same_weights(runs):
    """Run A dumped every step (``trainer.rollout_data_dir``); its step 5 trained again from its checkpoint of step 4
    on the dumped batch, with no vLLM engine, gives the same actor weights, bit for bit (fp32, colocated), and the
    same step metrics but the measured ones."""
    from easyrl.trainer.checkpoint import load_checkpoint_weights

    replay_dir, placement, startup = runs["replay"]
    assert placement == "TrainOnly" and "engine" not in startup  # no engine built
    original = load_checkpoint_weights(str(runs["a_dir"] / "global_step_5" / "actor"))
    replayed = load_checkpoint_weights(str(replay_dir / "global_step_5" / "actor"))
    assert original.keys() == replayed.keys()
    gap = max((original[k].double() - replayed[k].double()).abs().max().item() for k in original)
    print(f"REPLAY step 5: largest weight difference {gap:g} over {len(original)} tensors")
    assert all(torch.equal(original[k], replayed[k]) for k in original)
    ignored = ("rollout/slot_occupancy", "val/")
    a_row = {k: v for k, v in _comparable(_rows(runs["a_dir"])[5]).items() if not k.startswith(ignored)}
    replay_row = {k: v for k, v in _comparable(_rows(replay_dir)[5]).items() if not k.startswith(ignored)}
    assert {k: v for k, v in replay_row.items() if k in a_row} == {k: a_row[k] for k in replay_row if k in a_row}


def test_dead_worker_stops_the_trainer(runs):
    message, seconds, last = runs["dead_worker"]
    assert "worker rank 1 died" in message and str(last) in message and last.endswith("global_step_5")
    assert seconds < 60


def test_export_loads_in_transformers_and_vllm(runs, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "hf"
    checkpoint = runs["a_dir"] / "global_step_5"
    done = subprocess.run([sys.executable, "-m", "easyrl.export", str(checkpoint), str(out), "--dtype", "float32"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    base = Path(runs["model_path"])
    assert (out / "generation_config.json").read_bytes() == (base / "generation_config.json").read_bytes()
    prompt, response = runs["sequence"]
    script = REPO / "tests" / "scripts" / "score_exported.py"
    scored = subprocess.run([sys.executable, str(script), str(out), json.dumps(prompt), json.dumps(response)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0, scored.stderr[-3000:]
    result = json.loads(scored.stdout.strip().splitlines()[-1])
    actor = torch.tensor(runs["actor_log_probs"])
    assert actor.min() < -1.0  # a random model: real, non-trivial log-probs
    assert (torch.tensor(result["transformers"]) - actor).abs().max().item() < 1e-4
    assert (torch.tensor(result["vllm"]) - actor).abs().max().item() < LOGPROB_TOL
    # the in-run export (end of run A) is in the base model's dtype
    in_run = runs["a_dir"] / "huggingface"
    with safe_open(str(next(in_run.glob("*.safetensors"))), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert (in_run / "generation_config.json").read_bytes() == (base / "generation_config.json").read_bytes()
