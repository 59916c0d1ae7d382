"""The driver's side of request-level rollout: one thread keeps every vLLM engine of a worker group stepping, admits
each submitted group of samples to the least loaded engine at once, and hands every finished sample back to its
submission; a submission waits only for its own samples (docs/architecture.md, "The rollout engine").

Weights can change while requests are in flight (:meth:`RequestStream.paused`: no engine call runs in the pause, the
requests stay admitted; ``easyrl.workers.request_engine.RequestEngine.reload``), so a response may hold tokens of
several weight versions: ``token_versions`` in the batch (``StreamingRollout``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ContextManager, Optional

import ray
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.trainer.rollout import for_rollout, right_pad, routing_batch, trajectory_batch
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.group import WorkerError, WorkerGroup

__all__ = ["RequestStream", "StreamingRollout", "group_rows", "token_prompt"]

Sample = tuple[list[int], Optional[list[float]], list[int], Any]
"""A finished sample: ``(token_ids, log_probs | None, versions, routed_experts | None)`` (``RequestEngine``'s
``Finished``)."""


def group_rows(uids: list[str]) -> list[list[int]]:
    """The row indices of each run of equal consecutive ``uids`` (a prompt's group of ``n`` samples), in order."""
    return [[i for i, _ in rows] for _, rows in itertools.groupby(enumerate(uids), key=lambda item: item[1])]


def token_prompt(prompt_ids: list[int], max_tokens: int, uid: str, seed: Optional[int] = None) -> Batch:
    """A one-row prompt batch for :meth:`RequestStream.submit` from a prompt already rendered to token ids (text
    only; the agent endpoint's requests, ``easyrl.trainer.agent_endpoint``): ``raw_prompt_ids``, no images,
    ``max_tokens`` response tokens at most, ``uid``, and ``rollout_seed`` when ``seed`` is given. It holds no
    tensors, so one engine call should not mix it with rows of ``Generator.prompt_batch`` (``Batch.cat`` needs the
    same keys)."""
    extras: dict[str, list[Any]] = {"uid": [uid], "raw_prompt_ids": [list(prompt_ids)], "images": [[]],
                                    "max_tokens": [int(max_tokens)]}
    if seed is not None:
        extras["rollout_seed"] = [int(seed) % 2**31]
    return Batch(TensorDict({}, batch_size=[1]), extras)


@dataclass
class _Submission:
    rows: int
    overrides: Optional[dict[str, Any]]
    done: dict[int, Sample] = field(default_factory=dict)
    error: Optional[BaseException] = None


class RequestStream:
    """Keeps the engines of ``workers`` (``FSDPWorker.advance`` on each engine's ranks) busy request by request.
    ``slots``: the decode slots of each engine that the occupancy counts (``rollout/slot_occupancy``); ``max_steps``:
    the engine steps of one call at most (the longest a pause waits, in decode steps)."""

    def __init__(self, workers: WorkerGroup, slots: int, max_steps: int = 16):
        self.workers = workers
        self.slots = slots
        self.max_steps = max_steps
        engines = workers.rollout_dp_size
        self._cond = threading.Condition()
        self._queued: list[list[tuple[tuple[int, int], Batch]]] = [[] for _ in range(engines)]
        self._live = [0] * engines  # samples admitted to each engine (queued or in flight), not finished
        self._calls: dict[int, list[Any]] = {}  # engine -> its ranks' references of the call in flight
        self._submissions: dict[int, _Submission] = {}
        self._ids = itertools.count()
        self._paused = self._stopped = False
        self._busy = self._offered = 0
        self.submissions = 0  # submit calls so far
        self.returned = 0  # engine calls returned so far
        self._idle, self._idle_since = 0.0, time.perf_counter()  # seconds without a sample admitted
        self._failure: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, name="easyrl-requests", daemon=True)
        self._thread.start()

    # --------------------------------------------------------------------------------------------- the callers
    def submit(self, prompts: Batch, overrides: Optional[dict[str, Any]] = None) -> int:
        """Admit every row of ``prompts`` (a prompt batch, ``Generator.prompt_batch``), each group of equal ``uid``
        to the engine with the fewest samples; returns the submission's id for :meth:`wait`."""
        rows = for_rollout(prompts)
        with self._cond:
            if self._failure is not None:
                raise self._failure
            sid = next(self._ids)
            self.submissions += 1
            if self._idle_since is not None:
                self._idle, self._idle_since = self._idle + time.perf_counter() - self._idle_since, None
            self._submissions[sid] = _Submission(len(rows), overrides)
            for group in group_rows(list(rows["uid"])):
                engine = min(range(len(self._live)), key=self._live.__getitem__)
                self._queued[engine].extend(((sid, i), rows.select([i])) for i in group)
                self._live[engine] += len(group)
            self._cond.notify_all()
        return sid

    def wait(self, sid: int) -> list[Sample]:
        """The samples of submission ``sid`` in row order, once all finished (:meth:`collect` of it alone)."""
        return self.collect([sid], None)[sid]

    def collect(self, sids: list[int], timeout: Optional[float]) -> dict[int, list[Sample]]:
        """The samples of each submission among ``sids`` that finished (those are then forgotten), waiting up to
        ``timeout`` seconds (None: without limit) for at least one. Raises the engines' error, or ``CancelledError``
        when the stream was closed first."""
        with self._cond:
            def finished() -> list[int]:
                return [sid for sid in sids if self._submissions[sid].error is not None
                        or len(self._submissions[sid].done) == self._submissions[sid].rows]

            self._cond.wait_for(lambda: finished(), timeout)
            done = {sid: self._submissions.pop(sid) for sid in finished()}
        for sub in done.values():
            if sub.error is not None:
                raise sub.error
        return {sid: [sub.done[i] for i in range(sub.rows)] for sid, sub in done.items()}

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No engine call runs inside (it waits for those in flight, at most ``max_steps`` steps each); the admitted
        requests stay in the engines and continue after it."""
        with self._cond:
            self._paused = True
            self._cond.wait_for(lambda: not self._calls or self._stopped)
        try:
            yield
        finally:
            with self._cond:
                self._paused = False
                self._cond.notify_all()

    def in_flight(self) -> int:
        """Samples admitted and not finished, over all engines."""
        with self._cond:
            return sum(self._live)

    def wait_below(self, samples: int) -> None:
        """Block until fewer than ``samples`` are in flight (or the stream stopped)."""
        with self._cond:
            self._cond.wait_for(lambda: sum(self._live) < samples or self._stopped or self._failure is not None)

    def wait_submitted(self, count: int, timeout: float) -> bool:
        """Whether ``count`` submissions were made, waiting at most ``timeout`` seconds for them."""
        with self._cond:
            return self._cond.wait_for(lambda: self.submissions >= count or self._stopped, timeout)

    def take_idle_seconds(self) -> float:
        """The seconds since the last call during which no sample was admitted to any engine."""
        with self._cond:
            now = time.perf_counter()
            idle = self._idle + (now - self._idle_since if self._idle_since is not None else 0.0)
            self._idle, self._idle_since = 0.0, now if self._idle_since is not None else None
        return idle

    def take_slot_counts(self) -> tuple[int, int]:
        """The engines' decode slots ``(held, offered)`` summed over their steps since the last call."""
        with self._cond:
            counts, self._busy, self._offered = (self._busy, self._offered), 0, 0
        return counts

    def slot_occupancy(self) -> Optional[float]:
        """The share of the engines' decode slots that held a request since the last call (None: no step ran)."""
        busy, offered = self.take_slot_counts()
        return busy / offered if offered else None

    def close(self) -> None:
        """Stop the loop after the calls in flight, drop every request in the engines, and cancel the waiting
        submissions (their ``wait`` raises ``CancelledError``)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join()
        if self._failure is None:
            ray.get([ref for engine in range(len(self._live))
                     for ref in self.workers.submit_engine(engine, FSDPWorker.abort_requests)])
        with self._cond:
            for sub in self._submissions.values():
                sub.error = sub.error or CancelledError("the request stream was closed")
            self._queued = [[] for _ in self._live]
            self._live = [0] * len(self._live)
            self._cond.notify_all()

    # ---------------------------------------------------------------------------------------------- the loop
    def _start_calls(self) -> None:
        """Under the lock: one ``advance`` call on every idle engine that has requests (admissions of one
        ``overrides`` per call)."""
        for engine, queued in enumerate(self._queued):
            if engine in self._calls or not (queued or self._live[engine]):
                continue
            overrides = self._submissions[queued[0][0][0]].overrides if queued else None
            same = [self._submissions[sid].overrides == overrides for (sid, _), _ in queued]
            taken = [item for item, alike in zip(queued, same) if alike]
            self._queued[engine] = [item for item, alike in zip(queued, same) if not alike]
            prompts = Batch.cat([row for _, row in taken]) if taken else None
            self._calls[engine] = self.workers.submit_engine(
                engine, FSDPWorker.advance, [key for key, _ in taken], prompts, overrides, self.slots, self.max_steps)

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopped or self._calls or (not self._paused and (
                        any(self._queued) or any(self._live))))
                    if self._stopped and not self._calls:
                        return
                    if not self._paused and not self._stopped:
                        self._start_calls()
                    calls = dict(self._calls)
                if not calls:
                    continue
                firsts = {refs[0]: engine for engine, refs in calls.items()}
                ready, _ = ray.wait(list(firsts), num_returns=1, timeout=0.05)  # then admit to idle engines
                for ref in ready:
                    engine = firsts[ref]
                    result = ray.get(calls[engine])[0]  # every rank of the engine stepped alike
                    self._finish(engine, result)
        except BaseException as err:  # handed to every waiting submission
            failure = err if not isinstance(err, ray.exceptions.RayError) else WorkerError(str(err))
            with self._cond:
                self._failure = failure
                self._calls.clear()
                for sub in self._submissions.values():
                    sub.error = failure
                self._cond.notify_all()

    def _finish(self, engine: int, result: dict[str, Any]) -> None:
        with self._cond:
            del self._calls[engine]
            self.returned += 1
            for (sid, row), *sample in result["finished"]:
                self._submissions[sid].done[row] = tuple(sample)
                self._live[engine] -= 1
            self._busy += result["busy"]
            self._offered += result["offered"]
            if not any(self._live) and self._idle_since is None:
                self._idle_since = time.perf_counter()
            self._cond.notify_all()


class StreamingRollout:
    """A ``Rollout`` over a :class:`RequestStream` (made by ``make_stream`` when first needed, again after
    :meth:`close`): each call's samples are admitted at once and return as soon as the last of them finished, while
    other calls' samples keep the engines busy. Adds ``token_versions`` ``(bsz, R)`` (the weight version that sampled
    each response token, -1 on padding) to the trajectory layout, and ``routed_experts`` where the engines record
    routing (``easyrl.trainer.rollout.routing_batch``; a position's experts are those of the first forward that ran
    it, so of the weights that sampled the token after it)."""

    engines = 1  # any number of prompts: the stream spreads their groups over the engines itself

    def __init__(self, make_stream: Callable[[], RequestStream], response_length: int, pad_id: int):
        self.make_stream = make_stream
        self.response_length = response_length
        self.pad_id = pad_id
        self._stream: Optional[RequestStream] = None

    @property
    def stream(self) -> RequestStream:
        """The open stream (made now if there is none)."""
        if self._stream is None:
            self._stream = self.make_stream()
        return self._stream

    def generate(self, prompts: Batch, overrides: Optional[dict[str, Any]]) -> tuple[Batch, float]:
        """See ``Rollout.generate`` (no weight sync here: 0 s)."""
        stream = self.stream
        samples = stream.wait(stream.submit(prompts, overrides))
        log_probs = None if samples[0][1] is None else [sample[1] for sample in samples]
        batch = trajectory_batch(prompts, [sample[0] for sample in samples], self.response_length, self.pad_id,
                                 log_probs)
        batch["token_versions"] = right_pad([sample[2] for sample in samples], self.response_length, -1,
                                            torch.long)[0]
        if samples[0][3] is not None:  # routing replay: the engines' experts per token
            batch["routed_experts"] = routing_batch(prompts["prompt_mask"], self.response_length,
                                                    [sample[3] for sample in samples])
        return batch, 0.0

    def paused(self) -> ContextManager[None]:
        """``RequestStream.paused`` of the open stream (nothing to pause without one)."""
        return self._stream.paused() if self._stream is not None else nullcontext()

    def close(self) -> None:
        """Close the open stream (``RequestStream.close``), if any."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def slot_occupancy(self) -> Optional[float]:
        """``RequestStream.slot_occupancy`` (None without an open stream)."""
        return self._stream.slot_occupancy() if self._stream is not None else None
