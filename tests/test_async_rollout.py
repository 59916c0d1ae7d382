"""``easyrl.trainer.async_rollout`` without Ray: the staleness rule, the step a chunk trains, and the producer thread
against a fake generator (the prompts trained in order, none repeated or skipped, every gap within the bound, the
checkpoint's prompt position that of the last trained batch)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config import load_config
from easyrl.trainer import async_rollout
from easyrl.trainer.async_rollout import AheadBatches, Chunk, chunk_step, within_staleness

REPO = Path(__file__).resolve().parents[1]


def test_within_staleness_admits_gaps_up_to_the_bound_and_refuses_newer_samples():
    assert [within_staleness(5, v, 2) for v in (5, 4, 3, 2)] == [True, True, True, False]
    with pytest.raises(RuntimeError, match="weight version 6 would train the older version 5"):
        within_staleness(5, 6, 2)


def test_chunk_step_counts_chunks_into_batches_from_the_start_step():
    assert [chunk_step(made, 1, 2, 0) for made in range(6)] == [1, 1, 2, 2, 3, 3]
    assert [chunk_step(made, 4, 4, 7) for made in range(3)] == [8, 9, 10]


class Prompts:
    """A prompt stream of consecutive ints, ``size`` a batch; its state is the next int."""

    def __init__(self, size: int):
        self.next, self.size = 0, size

    def __iter__(self):
        while True:
            self.next += self.size
            yield {"prompt": list(range(self.next - self.size, self.next))}

    def state_dict(self):
        return {"next": self.next}


class FakeGenerator:
    """``make_batch`` of one sample per prompt (``prompt``: the int), taking a random few milliseconds."""

    def make_batch(self, stream, step, timing, metrics, groups, first_round):
        prompts = next(stream)["prompt"]
        assert len(prompts) == groups
        time.sleep(random.uniform(0, 0.01))
        timing["gen"] = 0.01
        return Batch(TensorDict({"x": torch.zeros(groups, 1)}, batch_size=[groups]), {"prompt": prompts}), None, {}, 0


class Engines:
    """``AheadEngines`` without Ray: no stream to wait on, a weight transfer that takes no time."""

    stream = None

    def close_stream(self):
        pass

    def send_weights(self, version):
        return 0.0


class Trainer:
    """The trainer's side of ``AheadBatches``: its step counter and prompt stream, checkpointed as the trainer does
    (``RayPPOTrainer.state_dict``)."""

    def __init__(self, config):
        self.global_step, self.train_dataloader = 0, Prompts(config.data.generation_batch_size)
        self.batches = AheadBatches(config, FakeGenerator(), None, Engines(), self.train_dataloader.state_dict, 6)

    def state_dict(self):
        return {"global_step": self.global_step,
                "prompt_stream": self.batches.prompt_position() or self.train_dataloader.state_dict()}

    def load_state_dict(self, state):
        self.batches.restart(state["global_step"], state["prompt_stream"])
        self.global_step, self.train_dataloader.next = state["global_step"], state["prompt_stream"]["next"]


def _trainer(*overrides: str) -> Trainer:
    return Trainer(load_config([f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m",
                                "data.val_files=null", "worker.rollout.n_gpus_per_node=1",
                                "data.rollout_batch_size=2", *overrides]))


def _train(trainer: Trainer, steps: int, states: list) -> list[tuple[list[int], list[int], dict]]:
    """``steps`` steps of (the step's prompts, their version gaps, its metrics), training a random few ms each; the
    state to checkpoint after each step is appended to ``states``."""
    stream, done = iter(trainer.train_dataloader), []
    for _ in range(steps):
        trainer.global_step += 1
        metrics: dict[str, float] = {}
        batch, _, _, _ = trainer.batches.next_batch(stream, trainer.global_step, {}, metrics)
        time.sleep(random.uniform(0, 0.02))
        trainer.batches.version += 1
        done.append((batch["prompt"], batch["version_gap"], metrics))
        states.append(trainer.state_dict())
    return done


@pytest.mark.parametrize("mode", [["trainer.rollout_mode=async", "trainer.max_staleness=2",
                                   "data.mini_rollout_batch_size=1"], ["trainer.rollout_mode=one_step_off"]])
def test_the_producer_keeps_the_order_and_the_bound_and_the_checkpoint_keeps_the_trained_position(mode):
    trainer = _trainer(*mode)
    batches = trainer.batches
    try:
        states = []
        steps = _train(trainer, 4, states)
        assert [p for prompts, _, _ in steps for p in prompts] == list(range(8))  # none repeated or skipped
        assert all(0 <= gap <= batches.max_staleness for _, gaps, _ in steps for gap in gaps)
        assert steps[0][1] == [0, 0] and sum(m["async/staleness_gap_0"] for _, _, m in steps) <= 8
        assert [state["prompt_stream"] for state in states] == [{"next": 2 * k} for k in (1, 2, 3, 4)]  # trained
        trainer.load_state_dict(states[1])  # resume step 2's checkpoint: steps 3 and 4 train the same prompts again
        assert (batches.version, batches.engine_version, len(batches._done)) == (2, None, 0)
        assert [prompts for prompts, _, _ in _train(trainer, 2, [])] == [steps[2][0], steps[3][0]]
    finally:
        batches.close()


def test_a_group_past_the_bound_is_dropped_counted_and_replaced():
    trainer = _trainer("trainer.rollout_mode=async", "data.mini_rollout_batch_size=1")
    trainer.load_state_dict({"global_step": 3, "prompt_stream": {"next": 0}})
    stale = Batch(TensorDict({"x": torch.zeros(1, 1)}, batch_size=[1]), {"prompt": [-1]})
    batches = trainer.batches
    batches._done[0] = Chunk((stale, {}, 0), 1, (-1, {"next": 0}), {}, {})  # version 1 for the trainer's 3: gap 2
    batches._made = batches._started = 1
    try:
        (prompts, gaps, metrics), = _train(trainer, 1, [])
        assert prompts == [0, 1] and gaps == [0, 0] and metrics["async/dropped_groups"] == 1
    finally:
        batches.close()


def test_the_first_step_waits_for_its_chunks_and_a_failed_producer_raises_in_the_trainer(monkeypatch):
    trainer = _trainer("trainer.rollout_mode=one_step_off")
    monkeypatch.setattr(FakeGenerator, "make_batch", lambda *args, **kwargs: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        _train(trainer, 1, [])
    trainer.batches.close()
    assert async_rollout.ONE_STEP == trainer.batches.max_staleness == 1


def test_a_sample_s_version_is_its_oldest_token_s_and_partial_samples_are_counted():
    from easyrl.trainer.async_rollout import sample_versions, token_version_metrics

    versions = torch.tensor([[2, 2, 3, -1], [3, 3, 3, 3], [-1, -1, -1, -1]])
    batch = Batch(TensorDict({"token_versions": versions}, batch_size=[3]), {})
    assert sample_versions(batch, started=1) == [2, 3, 1]  # no token: the chunk's start version
    assert sample_versions(Batch(TensorDict({}, batch_size=[2]), {}), started=4) == [4, 4]
    metrics = token_version_metrics(batch, version=3, max_staleness=2)
    assert metrics == {"async/token_gap_0": 5.0, "async/token_gap_1": 2.0, "async/token_gap_2": 0.0,
                       "async/partial_samples": 1.0}


def test_covered_seconds_counts_overlapping_chunks_once():
    from easyrl.trainer.async_rollout import covered_seconds

    assert covered_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.8)]) == 4.0
    assert covered_seconds([]) == 0.0


def test_groups_are_runs_of_equal_uids_and_draws_are_numbered_per_thread():
    import threading

    from easyrl.trainer.async_rollout import Draws
    from easyrl.trainer.request_stream import group_rows

    assert group_rows(["a", "a", "b", "b", "a"]) == [[0, 1], [2, 3], [4]]
    prompts = Prompts(1)
    draws = Draws(iter(prompts), prompts.state_dict)
    seen = []

    def draw():
        next(draws)
        seen.append(draws.last())

    threads = [threading.Thread(target=draw) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen, key=lambda d: d[0]) == [(k, {"next": k + 1}) for k in range(8)]


def test_the_mode_picks_the_placement_once():
    from easyrl.config.placement import Placement

    def placement(*overrides):
        return load_config([f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m",
                            "data.val_files=null", "data.rollout_batch_size=4", *overrides]).placement

    split = ["worker.rollout.n_gpus_per_node=2", "trainer.nnodes=1"]
    assert placement() == Placement(split=False, max_staleness=0, chunk_groups=4, engine_devices=0)
    assert placement("trainer.rollout_mode=one_step_off", *split) == Placement(True, 1, 4, 2)
    assert placement("trainer.rollout_mode=async", "trainer.max_staleness=3", "data.mini_rollout_batch_size=2",
                     *split) == Placement(True, 3, 2, 2)


def test_a_multi_turn_sample_s_token_versions_are_its_assistant_tokens_and_minus_one_elsewhere():
    from easyrl.trainer.multi_turn import token_versions

    # two assistant turns (versions 3, then 4 after a transfer) around a tool turn; the budget cut the last turn
    assert token_versions([1, 1, 0, 0, 1, 1], [3, 3, 4, 4, 4]) == [3, 3, -1, -1, 4, 4]
    assert token_versions([0, 1], [5, 5, 5]) == [-1, 5]
