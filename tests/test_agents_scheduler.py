"""The round scheduler of the multi-turn rollout (``easyrl.agents.scheduler``) with a fake clock, fake tool futures
and a scripted engine: a slow tool does not stall the other trajectories, rounds list trajectories in the prompt
order, and the trajectories are the same as with the round barrier."""

from __future__ import annotations

import pytest

from easyrl.agents.executor import ToolResult
from easyrl.agents.parsers import hermes
from easyrl.agents.scheduler import run_requests, run_turns, start_round
from easyrl.agents.trajectory import Trajectory, TurnLoop

ROUND_S_PER_TRAJ = 0.1  # the fake engine's seconds per trajectory in a round
TOOL_S = {"fast": 0.01, "slow": 2.0}


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeFuture:
    def __init__(self, clock, call):
        self.clock, self.call, self.due = clock, call, clock.t + TOOL_S[call["name"]]

    @property
    def done(self) -> bool:
        return self.clock.t >= self.due

    @property
    def result(self):
        return ToolResult(f"{self.call['name']} ok", "ok") if self.done else None


class FakeExecutor:
    """Tool calls that take ``TOOL_S[name]`` seconds of the fake clock; ``wait`` moves the clock."""

    def __init__(self, clock):
        self.clock = clock

    def submit(self, calls):
        return [FakeFuture(self.clock, call) for call in calls]

    def poll(self):
        pass

    def wait(self, futures, until):
        due = min(f.due for f in futures if not f.done)
        assert until > self.clock.t, "the scheduler waits for nothing (it would spin)"
        self.clock.t = min(due, until)


def _engine(tokenizer, clock, rounds):
    """Trajectory ``p`` (prompt ``[p]``) calls the ``slow`` tool in its first turn if ``p == 0``, else ``fast``;
    ``fast`` in its second; answers in its third. Each round costs ``ROUND_S_PER_TRAJ`` per trajectory."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(active, round_):
        rounds.append([t.prompt_ids[0] for t in active])
        clock.t += ROUND_S_PER_TRAJ * len(active)
        out = []
        for traj in active:
            name = "slow" if traj.prompt_ids[0] == 0 and traj.assistant_turns == 0 else "fast"
            text = (f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>' if traj.assistant_turns < 2
                    else f"The answer is {traj.prompt_ids[0]}.")
            ids = tokenizer.encode(text, add_special_tokens=False) + [end]
            out.append((ids, [-0.5] * len(ids)))
        return out
    return generate


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path("qwen2_5"))


def _run(tokenizer, patience):
    clock, rounds = Clock(), []
    loop = TurnLoop(tokenizer, hermes, FakeExecutor(clock))
    trajectories = [Trajectory([p], 300) for p in range(3)]
    run_turns(loop, trajectories, _engine(tokenizer, clock, rounds), patience, clock)
    return trajectories, rounds, clock.t


def test_start_round():
    assert not start_round(ready=0, waiting=3, waited_s=9.0, patience_s=0.1)  # nothing to generate
    assert start_round(ready=2, waiting=0, waited_s=0.0, patience_s=0.1)  # nobody to wait for
    assert not start_round(ready=2, waiting=1, waited_s=0.05, patience_s=0.1)  # a late tool: wait a little
    assert start_round(ready=2, waiting=1, waited_s=0.1, patience_s=0.1)  # ... then go without it
    assert not start_round(ready=2, waiting=1, waited_s=1e9, patience_s=float("inf"))  # the round barrier


def test_a_slow_tool_does_not_stall_the_others(tokenizer):
    trajectories, rounds, seconds = _run(tokenizer, patience=0.25)
    barrier, barrier_rounds, barrier_seconds = _run(tokenizer, patience=float("inf"))
    # the barrier: every round waits for trajectory 0's 2 s tool
    assert barrier_rounds == [[0, 1, 2]] * 3
    # the scheduler: 1 and 2 go on (twice) while 0's tool runs; 0 rides later rounds alone; prompt order kept
    assert rounds == [[0, 1, 2], [1, 2], [1, 2], [0], [0]]
    assert seconds == pytest.approx(0.3 + 2.0 + 0.1 + 0.01 + 0.1)
    assert seconds < barrier_seconds == pytest.approx(0.3 + 2.0 + 0.3 + 0.01 + 0.3)
    # the same trajectories whichever round each turn rode in
    for traj, ref in zip(trajectories, barrier):
        assert traj.done and traj.assistant_turns == 3
        assert (traj.response_ids, traj.response_mask, traj.log_probs) == (
            ref.response_ids, ref.response_mask, ref.log_probs)
        assert traj.messages == ref.messages and traj.tool_calls == ref.tool_calls
    assert [c["result"] for c in trajectories[0].tool_calls] == ["slow ok", "fast ok"]


def test_a_round_waits_briefly_for_tools_that_are_almost_done(tokenizer):
    # with a patience longer than the 2 s tool, the scheduler is the barrier again
    _, rounds, _ = _run(tokenizer, patience=100.0)
    assert rounds == [[0, 1, 2]] * 3


class FakeRequests:
    """A scripted request-level engine on the fake clock: a submitted turn is generated ``ROUND_S_PER_TRAJ`` seconds
    later (one at a time, in submission order), as ``_engine`` would write it."""

    def __init__(self, tokenizer, clock, executor):
        self.generate, self.clock, self.executor = _engine(tokenizer, clock, []), clock, executor
        self.queue, self.done, self.order = [], {}, []

    def submit(self, traj):
        self.queue.append(traj)
        return traj.prompt_ids[0], traj.assistant_turns  # the handle: which trajectory's which turn

    def collect(self, handles, timeout):
        traj = self.queue.pop(0)
        self.order.append(traj.prompt_ids[0])
        (out,) = self.generate([traj], 0)
        return {(traj.prompt_ids[0], traj.assistant_turns): out}


def test_by_request_a_slow_tool_holds_up_only_its_own_trajectory(tokenizer):
    clock = Clock()
    executor = FakeExecutor(clock)
    loop = TurnLoop(tokenizer, hermes, executor)
    engine = FakeRequests(tokenizer, clock, executor)
    trajectories = [Trajectory([p], 300) for p in range(3)]
    run_requests(loop, trajectories, engine.submit, engine.collect)
    # 1 and 2 run all their turns while 0's 2 s tool runs; 0's next turn goes as soon as it answers
    assert engine.order == [0, 1, 2, 1, 2, 1, 2, 0, 0]
    assert clock.t == pytest.approx(0.1 + 2.0 + 0.1 + 0.01 + 0.1)  # 0: a turn, its tool, its own turns only
    barrier, _, _ = _run(tokenizer, patience=float("inf"))
    for traj, ref in zip(trajectories, barrier):  # the same trajectories as the round barrier's
        assert traj.done and (traj.response_ids, traj.response_mask, traj.tool_calls) == (
            ref.response_ids, ref.response_mask, ref.tool_calls)
