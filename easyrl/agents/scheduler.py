"""When the next assistant round starts: the engine keeps generating while tools run, so one slow tool does not stall
the batch.

The engines take a batch of requests at a time (``Generate``). After a round, the tool calls of its trajectories
are submitted to the process pool as futures (``ToolExecutor.submit``) and the driver waits for them only while
that is cheap: the next round starts as soon as every call is answered, or once at least one trajectory is ready
(its tools answered, or it had none) and the wait has lasted ``patience`` (``worker.rollout.multi_turn.patience``,
0.25) times the last round's generation time (``MIN_WAIT_S`` at least). A trajectory whose tool is still running
skips that round and joins a later one (the colocated engines take batches, so the scheduling is done here).
``patience=inf`` is the round barrier: every round waits for the slowest tool (bounded by ``tool_timeout_s``).

Determinism: a round's batch lists its trajectories in the prompt order, and the sampling seed of a turn depends on
the sample and the turn's number, not on the round it rode in (``easyrl.trainer.multi_turn``), so the trajectories
are the same whatever the tools' timing, up to vLLM's batch invariance; the batch keeps the prompt order.
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["PATIENCE", "MIN_WAIT_S", "start_round", "run_turns"]

PATIENCE = 0.25
"""How long the driver waits for late tool calls before a round starts without them, in units of the last round's
generation time: waiting idles the engines, a round without the late ones costs them a later round. The default of
``run_turns``; a training run takes ``worker.rollout.multi_turn.patience`` (the same default)."""

MIN_WAIT_S = 0.05
"""Seconds the driver waits at least (a tool call's round trip through the process pool takes milliseconds; a round
does not start without calls that are merely in transit)."""


def start_round(ready: int, waiting: int, waited_s: float, patience_s: float) -> bool:
    """Whether the next generation round starts now: some trajectory is ready (``ready`` of them can generate their
    next turn) and either none waits for its tool calls (``waiting``) or the wait since the last round ended
    (``waited_s``) reached ``patience_s`` (``PATIENCE`` x the last round's generation time)."""
    return ready > 0 and (waiting == 0 or waited_s >= patience_s)


def _open(traj: Any) -> bool:
    return not traj.done and traj.remaining > 0


def run_turns(loop: Any, trajectories: list, generate: Callable, patience: float = PATIENCE,
              clock: Callable[[], float] = time.monotonic) -> list:
    """Run ``trajectories`` to their end with ``loop`` (a ``TurnLoop``: its parser, executor and turn steps).

    ``trajectories`` (in the prompt order) are updated in place and returned; ``generate(trajectories, round) ->
    [(ids, log_probs)]``; ``patience``: see ``PATIENCE`` (``float("inf")``: wait for every tool call, the round
    barrier); ``clock``: monotonic seconds (a fake one in tests).
    """
    order = {id(t): i for i, t in enumerate(trajectories)}
    ready = [t for t in trajectories if _open(t)]
    waiting: list[tuple[Any, list]] = []  # (trajectory, its tool futures)
    round_, round_s, ended = 0, 0.0, clock()
    while ready or waiting:
        still = []
        for traj, futures in waiting:
            if all(f.done for f in futures):
                loop._follow_up([traj], [f.result for f in futures])
                if _open(traj):
                    ready.append(traj)
            else:
                still.append((traj, futures))
        waiting = still
        patience_s = max(MIN_WAIT_S, patience * round_s)
        if start_round(len(ready), len(waiting), clock() - ended, patience_s):
            batch, ready = sorted(ready, key=lambda t: order[id(t)]), []
            start = clock()
            outputs = generate(batch, round_)
            round_s, round_ = clock() - start, round_ + 1
            for traj, (ids, log_probs) in zip(batch, outputs):
                loop._assistant_turn(traj, ids, log_probs)
            for traj in batch:
                if traj.done:
                    continue
                calls = loop.parser(traj.messages[-1]["content"])
                if calls and loop.executor is not None:
                    waiting.append((traj, loop.executor.submit(calls)))
                    continue
                loop._follow_up([traj], [])  # no calls (environment or final answer), or calls without tools
                if _open(traj):
                    ready.append(traj)
            ended = clock()
        elif waiting:
            until = ended + patience_s if ready else float("inf")
            loop.executor.wait([f for _, futures in waiting for f in futures], until)
    return trajectories
