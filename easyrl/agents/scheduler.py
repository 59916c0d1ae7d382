"""When a trajectory's next assistant turn is generated (docs/agents.md, "Scheduling").

By request (:func:`run_requests`, ``worker.rollout.multi_turn.patience: null``, the default): each trajectory's next
turn is submitted to the engines as soon as its tools answered, and its tools as soon as its turn is generated; a slow
trajectory or tool holds up nothing but itself. In rounds (:func:`run_turns`, a number): after a round its tool calls are submitted as futures; the next round starts once every call is answered, or once a
trajectory is ready and the wait lasted ``patience`` times the last round's generation time (``MIN_WAIT_S`` at least);
a trajectory whose tool is late joins a later round. A round lists its trajectories in prompt order and a turn's seed
does not depend on its round, so results do not depend on the tools' timing. ``patience=inf`` is the round barrier.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

__all__ = ["PATIENCE", "MIN_WAIT_S", "POLL_S", "start_round", "run_turns", "run_requests"]

PATIENCE = 0.25
"""Wait for late tool calls, in units of the last round's generation time (``worker.rollout.multi_turn.patience``)."""

MIN_WAIT_S = 0.05
"""Seconds waited at least (a call's round trip through the pool takes milliseconds)."""

POLL_S = 0.01
"""Seconds :func:`run_requests` waits for a generated turn before it looks at the tools again, while tools run."""


def start_round(ready: int, waiting: int, waited_s: float, patience_s: float) -> bool:
    """Whether a round starts now: some trajectory is ready and none is ``waiting`` or ``waited_s >= patience_s``."""
    return ready > 0 and (waiting == 0 or waited_s >= patience_s)


def _open(traj: Any) -> bool:
    return not traj.done and traj.remaining > 0


def _after_turn(loop: Any, traj: Any, ready: list, waiting: list) -> None:
    """After ``traj``'s assistant turn: its tool calls go to the pool (``waiting``), else its follow-up turn is added
    now (environment, final answer, calls without tools) and an open ``traj`` is ``ready`` again."""
    if traj.done:
        return
    calls = loop.parser(traj.messages[-1]["content"])
    if calls and loop.executor is not None:
        waiting.append((traj, loop.executor.submit(calls)))
        return
    loop._follow_up(traj, [])
    if _open(traj):
        ready.append(traj)


def _answered(loop: Any, waiting: list, ready: list) -> list:
    """Follow up every trajectory of ``waiting`` whose tool calls are all answered (the open ones become ``ready``);
    returns those still waiting."""
    still = []
    for traj, futures in waiting:
        if all(f.done for f in futures):
            loop._follow_up(traj, [f.result for f in futures])
            if _open(traj):
                ready.append(traj)
        else:
            still.append((traj, futures))
    return still


def run_turns(loop: Any, trajectories: list, generate: Callable, patience: float = PATIENCE,
              clock: Callable[[], float] = time.monotonic) -> list:
    """Run ``trajectories`` (prompt order, updated in place and returned) to their end with ``loop`` (a
    ``TurnLoop``); ``clock`` gives monotonic seconds."""
    order = {id(t): i for i, t in enumerate(trajectories)}
    ready = [t for t in trajectories if _open(t)]
    waiting: list[tuple[Any, list]] = []  # (trajectory, its tool futures)
    round_, round_s, ended = 0, 0.0, clock()
    while ready or waiting:
        waiting = _answered(loop, waiting, ready)
        patience_s = max(MIN_WAIT_S, patience * round_s)
        if start_round(len(ready), len(waiting), clock() - ended, patience_s):
            batch, ready = sorted(ready, key=lambda t: order[id(t)]), []
            start = clock()
            outputs = generate(batch, round_)
            round_s, round_ = clock() - start, round_ + 1
            for traj, (ids, log_probs) in zip(batch, outputs):
                loop._assistant_turn(traj, ids, log_probs)
            for traj in batch:
                _after_turn(loop, traj, ready, waiting)
            ended = clock()
        elif waiting:
            until = ended + patience_s if ready else float("inf")
            loop.executor.wait([f for _, futures in waiting for f in futures], until)
    return trajectories


def run_requests(loop: Any, trajectories: list, submit: Callable[[Any], Any],
                 collect: Callable[[list, Optional[float]], dict]) -> list:
    """Run ``trajectories`` (updated in place and returned) to their end with ``loop`` (a ``TurnLoop``), each on its
    own: ``submit(trajectory)`` starts its next assistant turn on the engines and returns a handle;
    ``collect(handles, timeout)`` returns ``{handle: (ids, log_probs)}`` for those of ``handles`` generated so far,
    waiting up to ``timeout`` seconds (None: until one is) for at least one. A turn's tool calls run as soon as it is
    generated, its next turn is submitted as soon as they are all answered."""
    ready = [t for t in trajectories if _open(t)]
    generating: dict[Any, Any] = {}  # handle -> trajectory
    waiting: list[tuple[Any, list]] = []  # (trajectory, its tool futures)
    while ready or generating or waiting:
        for traj in ready:
            generating[submit(traj)] = traj
        ready = []
        finished = collect(list(generating), POLL_S if waiting else None) if generating else {}
        for handle, (ids, log_probs) in finished.items():
            traj = generating.pop(handle)
            loop._assistant_turn(traj, ids, log_probs)
            _after_turn(loop, traj, ready, waiting)
        if waiting and not generating and not ready:  # only tools run: wait for one more answer
            loop.executor.wait([f for _, futures in waiting for f in futures], float("inf"))
        elif waiting:
            loop.executor.poll()  # collect the answers so far
        waiting = _answered(loop, waiting, ready)
    return trajectories
