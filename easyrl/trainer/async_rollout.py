"""The batch source of the split placement (``trainer.rollout_mode: one_step_off`` and ``async``): the rollout engines
run on devices of their own (``easyrl.trainer.placement.Split``) and keep generating while the trainer's workers train
(docs/async.md).

The engines are driven request by request (``easyrl.trainer.request_stream``). A dispatcher thread starts *chunks*
(one ``Generator.make_batch`` call each, in a thread of its own: ``data.mini_rollout_batch_size`` prompt groups in
``async``, ``data.rollout_batch_size`` one step off) whenever an engine slot is free and the staleness bound allows, so
the engines stay full across chunks; a step takes the chunks in the order they were started. Staleness is bounded as
in AReaL (Fu et al. 2025, arXiv:2505.24298, sec. 4.2): a chunk starts only if the step that will train it is at most
``trainer.max_staleness`` versions (one step off: 1) past the engines' weights. New weights reach the engines at the
start of each step without waiting for any chunk: the requests in flight are kept and continue on the new weights
(partial rollouts), each token tagged with the version that sampled it (``token_versions``); a sample's
``weight_version`` is the oldest of its tokens'.

The behaviour log-probs are vLLM's (``rollout_log_probs``, per token of the weights that sampled it); the
importance-sampling corrections apply to them unchanged, and the weight-sync check is off.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

import torch

from easyrl.batch import Batch
from easyrl.config import PPOConfig
from easyrl.trainer.generation import Generator
from easyrl.trainer.scoring import Scorer

ONE_STEP = 1
"""``one_step_off``'s maximum staleness: the largest version gap of a trained sample."""


def within_staleness(version: int, weight_version: int, max_staleness: int) -> bool:
    """Whether samples of ``weight_version`` may train the weights of ``version`` (both in training steps): their
    gap ``version - weight_version`` is at most ``max_staleness``. Raises ``RuntimeError`` on a negative gap (a bug)."""
    if version < weight_version:
        raise RuntimeError(f"samples of weight version {weight_version} would train the older version {version}")
    return version - weight_version <= max_staleness


def chunk_step(made: int, chunk_groups: int, batch_groups: int, start_step: int) -> int:
    """The 1-based step that trains the ``made``-th chunk (0-based) of ``chunk_groups`` groups, the run having trained
    ``start_step`` steps when its producer started and each step taking ``batch_groups`` groups in queue order."""
    return start_step + made * chunk_groups // batch_groups + 1


class Draws:
    """The prompt stream shared by the chunks' threads: each ``next`` under a lock, numbered; :meth:`last` is the
    calling thread's latest draw ``(number, position of the stream after it)``."""

    def __init__(self, stream: Iterator[dict[str, list]], position: Any):
        self.stream, self.position = stream, position  # position(): the stream's state (a state_dict)
        self._lock, self._count, self._local = threading.Lock(), itertools.count(), threading.local()

    def __iter__(self) -> "Draws":
        return self

    def __next__(self) -> dict[str, list]:
        with self._lock:
            item = next(self.stream)
            self._local.last = (next(self._count), self.position())
        return item

    def last(self) -> tuple[int, Any]:
        """This thread's latest draw; raises ``AttributeError`` before its first."""
        return self._local.last


@dataclass
class Chunk:
    """One ``make_batch`` call's groups: ``made`` its ``(batch, scores, failures)`` (scored), ``version`` the
    engines' weights when it started (the oldest any of its tokens can be of), ``draw`` its last prompt draw
    ``(number, stream position after it)``, ``timing`` (seconds) and ``metrics`` of its generation, ``span`` its
    ``(start, end)`` (``time.perf_counter`` seconds)."""

    made: tuple[Batch, dict[str, list[float]], int]
    version: int
    draw: tuple[int, Any]
    timing: dict[str, float]
    metrics: dict[str, float]
    span: tuple[float, float] = (0.0, 0.0)


def sample_versions(batch: Batch, started: int) -> list[int]:
    """Each sample's weight version: the oldest of its tokens' (``token_versions`` ``(bsz, R)``, -1 on padding),
    ``started`` (the engines' version when its chunk started) for a sample without tokens or versions."""
    if "token_versions" not in batch:
        return [started] * len(batch)
    versions = batch["token_versions"].masked_fill(batch["token_versions"] < 0, torch.iinfo(torch.long).max)
    oldest = versions.min(dim=-1).values
    return [started if v == torch.iinfo(torch.long).max else int(v) for v in oldest.tolist()]


def covered_seconds(spans: list[tuple[float, float]]) -> float:
    """The seconds covered by at least one of ``spans`` (``(start, end)`` pairs): overlapping chunks counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def token_version_metrics(batch: Batch, version: int, max_staleness: int) -> dict[str, float]:
    """``async/token_gap_<g>``: the batch's response tokens sampled ``g`` versions before ``version`` (``g`` up to
    ``max_staleness``), and ``async/partial_samples``: samples whose tokens span several weight versions (an
    in-flight weight update reached them); empty without ``token_versions``."""
    if "token_versions" not in batch:
        return {}
    versions = batch["token_versions"]
    valid = versions >= 0
    metrics = {f"async/token_gap_{g}": float(((version - versions == g) & valid).sum())
               for g in range(max_staleness + 1)}
    newest = versions.max(dim=-1).values
    oldest = versions.masked_fill(~valid, torch.iinfo(torch.long).max).min(dim=-1).values
    metrics["async/partial_samples"] = float(((newest > oldest) & valid.any(dim=-1)).sum())
    return metrics


class AheadEngines(Protocol):
    """What :class:`AheadBatches` needs of the engines (``easyrl.trainer.placement.Split``)."""

    stream: Any
    """The ``RequestStream`` the chunks generate through, opened when first read (None: none to wait on, e.g.
    without Ray)."""

    def close_stream(self) -> None:
        """Close the open stream: its requests are dropped, its waiting submissions cancelled."""
        ...

    def send_weights(self, version: int) -> float:
        """Send the trainer's weights, ``version`` steps trained, to the engines, requests in flight kept; returns the
        seconds taken."""
        ...


class AheadBatches:
    """The batch source that generates ahead of the training (module docstring): ``config``'s placement bounds the
    staleness and sizes the chunks; ``generator`` makes and ``scorer`` scores them through the ``engines``;
    ``position`` returns the prompt stream's state (a ``state_dict``); ``training_steps`` the run's length.

    ``version``: the steps the trainer's weights have trained; ``engine_version``: the engines' (None before the
    first transfer); ``trained_position``: the prompt stream's state after the latest prompt drawn by a trained
    chunk, which the checkpoint saves. Metrics: ``async/staleness_mean`` and ``_max`` (version gap of the step's
    samples, from their oldest token), ``async/staleness_gap_<g>`` (samples of gap ``g``), ``async/token_gap_<g>``
    (response tokens of gap ``g``), ``async/partial_samples`` (samples whose tokens span several versions),
    ``async/dropped_groups`` (past ``max_staleness``), ``async/train_idle_s`` (trainer waited),
    ``async/rollout_idle_s`` (engines without a request since the last step), ``timing_s/weight_transfer``,
    ``async/train_tokens_per_s`` (the step's tokens over the trainer's busy seconds).
    """

    def __init__(self, config: PPOConfig, generator: Generator, scorer: Scorer, engines: AheadEngines,
                 position: Callable[[], Any], training_steps: int):
        self.config, self.generator, self.scorer, self.engines = config, generator, scorer, engines
        self.position, self.training_steps = position, training_steps
        self.max_staleness = config.placement.max_staleness
        self.chunk_groups = config.placement.chunk_groups
        self.version = 0
        self.engine_version: Optional[int] = None
        self.trained_position: Optional[dict[str, Any]] = None
        self._cond = threading.Condition()  # guards the fields below
        self._done: dict[int, Chunk] = {}  # finished chunks by start order
        self._producer: Optional[threading.Thread] = None
        self._chunks: list[threading.Thread] = []
        self._started = self._taken = 0  # chunks started / taken by a step since the producer started
        self._made = self._start_step = 0  # chunks started and not dropped; the steps trained when it started
        self._stop = False
        self._failure: Optional[BaseException] = None
        self._trained_draw = -1

    # ----------------------------------------------------------------------------------------- the producer
    def _next_step(self) -> int:
        return chunk_step(self._made, self.chunk_groups, self.config.data.rollout_batch_size, self._start_step)

    def _may_start(self) -> bool:
        step = self._next_step()
        return self._stop or self._failure is not None or (
            step <= self.training_steps and within_staleness(step - 1, self.engine_version, self.max_staleness))

    def _produce(self, draws: Draws) -> None:
        """The dispatcher thread: a chunk (thread) whenever an engine slot is free and the staleness bound allows,
        each started once the one before it has admitted its first requests, until asked to stop."""
        per_step = self.config.data.rollout_batch_size // self.chunk_groups
        stream = self.engines.stream
        while True:
            if stream is not None:
                stream.wait_below(stream.slots * stream.workers.rollout_dp_size)
            with self._cond:
                self._cond.wait_for(self._may_start)
                if self._stop or self._failure is not None:
                    return
                step, version, index = self._next_step(), self.engine_version, self._started
                self._made, self._started = self._made + 1, self._started + 1
            submitted = stream.submissions if stream is not None else 0
            thread = threading.Thread(target=self._make_chunk, args=(draws, step, version, index, index % per_step),
                                      name=f"easyrl-chunk-{index}", daemon=True)
            self._chunks.append(thread)
            thread.start()
            while stream is not None and thread.is_alive() and not stream.wait_submitted(submitted + 1, 0.1):
                pass

    def _make_chunk(self, draws: Draws, step: int, version: int, index: int, first_round: int) -> None:
        """One chunk's thread: generate and score it, then file it under ``index``."""
        began = time.perf_counter()
        try:
            timing: dict[str, float] = {}
            metrics: dict[str, float] = {}
            batch, pending, scores, failures = self.generator.make_batch(
                draws, step, timing, metrics, groups=self.chunk_groups, first_round=first_round)
            if pending is not None:  # scored in the reward actor: the chunk is filed scored
                failures += self.scorer.wait(batch, pending, list(range(len(batch))))
            chunk = Chunk((batch, scores, failures), version, draws.last(), timing, metrics,
                          (began, time.perf_counter()))
            with self._cond:
                self._done[index] = chunk
                self._cond.notify_all()
        except CancelledError:  # the stream was closed: the producer is stopping
            pass
        except BaseException as err:  # handed to the trainer's thread (next_batch raises it)
            with self._cond:
                self._failure = self._failure or err
                self._cond.notify_all()

    def close(self) -> None:
        """Stop the producer, drop the requests in flight and forget the chunks generated ahead."""
        if self._producer is not None:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            self.engines.close_stream()  # the chunks waiting for their samples are cancelled
            self._producer.join()
            for thread in self._chunks:
                thread.join()
        self._producer, self._chunks, self._stop, self._failure = None, [], False, None
        self._made = self._started = self._taken = 0
        self._trained_draw = -1
        self._done.clear()

    # ------------------------------------------------------------------------------------------ the trainer
    def update_engines(self) -> float:
        """Send the trainer's weights now unless the engines hold them (requests in flight kept); returns the
        seconds taken."""
        if self.engine_version == self.version:
            return 0.0
        seconds = self.engines.send_weights(self.version)
        with self._cond:
            self.engine_version = self.version
            self._cond.notify_all()
        return seconds

    def next_batch(self, prompt_stream: Iterator[dict[str, list]], step: int, timing: dict[str, float],
                   metrics: dict[str, float]) -> tuple[Batch, Any, dict[str, list[float]], int]:
        """Step ``step``'s batch (``Generator.make_batch``'s return), from the chunks generated ahead in the order
        they started (dropping those past ``max_staleness``), tagged per sample with ``weight_version`` and
        ``version_gap``; sends the weights first (see the module docstring)."""
        waited = time.perf_counter()
        timing["weight_transfer"] = self.update_engines()
        if self._producer is None:
            self._start_step = step - 1
            draws = Draws(prompt_stream, self.position)
            self._producer = threading.Thread(target=self._produce, args=(draws,), name="easyrl-rollout", daemon=True)
            self._producer.start()
        chunks, dropped = [], 0
        with self._cond:
            while len(chunks) * self.chunk_groups < self.config.data.rollout_batch_size:
                self._cond.wait_for(lambda: self._taken in self._done or self._failure is not None)
                if self._failure is not None:
                    raise self._failure
                chunk = self._done.pop(self._taken)
                self._taken += 1
                oldest = min(sample_versions(chunk.made[0], chunk.version))
                if within_staleness(self.version, oldest, self.max_staleness):
                    chunks.append(chunk)
                else:  # the producer makes one more in its place
                    dropped, self._made = dropped + self.chunk_groups, self._made - 1
                    self._cond.notify_all()
        metrics["async/train_idle_s"] = time.perf_counter() - waited - timing["weight_transfer"]
        if self.engines.stream is not None:
            metrics["async/rollout_idle_s"] = self.engines.stream.take_idle_seconds()
        count, position = max(chunk.draw for chunk in chunks)
        if count > self._trained_draw:
            self._trained_draw, self.trained_position = count, position
        generated: dict[str, list[float]] = defaultdict(list)
        for chunk in chunks:
            for table, values in ((timing, chunk.timing), (metrics, chunk.metrics), (generated, chunk.made[1])):
                for key, value in values.items():
                    table[key] = table.get(key, type(value)()) + value
        if "gen" in timing:  # chunks generate side by side: the seconds any of them generated
            timing["gen"] = min(timing["gen"], covered_seconds([chunk.span for chunk in chunks]))
        batch = Batch.cat([chunk.made[0] for chunk in chunks])
        batch["weight_version"] = [v for c in chunks for v in sample_versions(c.made[0], c.version)]
        batch["version_gap"] = gaps = [self.version - version for version in batch["weight_version"]]
        metrics["async/staleness_mean"], metrics["async/staleness_max"] = sum(gaps) / len(gaps), float(max(gaps))
        metrics.update({f"async/staleness_gap_{g}": float(gaps.count(g)) for g in range(self.max_staleness + 1)})
        metrics.update(token_version_metrics(batch, self.version, self.max_staleness))
        metrics["async/dropped_groups"] = float(dropped)
        return batch, None, generated, sum(chunk.made[2] for chunk in chunks)

    def step_done(self, metrics: dict[str, float]) -> None:
        """After a step that trained :meth:`next_batch`'s batch: the trainer's weights are one version newer; adds
        ``async/train_tokens_per_s``."""
        self.version += 1
        busy = metrics["timing_s/step"] - metrics["async/train_idle_s"] - metrics["timing_s/weight_transfer"]
        metrics["async/train_tokens_per_s"] = metrics["perf/total_num_tokens"] / max(busy, 1e-9)

    def prompt_position(self) -> Optional[dict[str, Any]]:
        """The prompt stream's state after the last trained batch, for the checkpoint (None before the first)."""
        return self.trained_position

    def restart(self, global_step: int, prompt_position: Any) -> None:
        """For a resume at ``global_step`` (the prompt stream at ``prompt_position``): the chunks generated ahead are
        dropped, the engines get the loaded weights before the next batch. Call before the prompt stream is moved."""
        self.close()
        self.version, self.engine_version, self.trained_position = global_step, None, prompt_position
