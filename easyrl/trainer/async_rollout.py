"""``trainer.rollout_mode: one_step_off`` and ``async``: the rollout engines run on devices of their own
(``RolloutWorker``s, ``worker.rollout.n_gpus_per_node``) and keep generating while the trainer's workers train
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
from typing import Any, Optional

import torch

from easyrl.batch import Batch
from easyrl.trainer.ray_trainer import RayPPOTrainer
from easyrl.trainer.request_stream import RequestStream, StreamingRollout
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.group import WorkerGroup, gather
from easyrl.workers.rollout_worker import RolloutWorker

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


class AsyncRolloutTrainer(RayPPOTrainer):
    """``RayPPOTrainer`` with the rollout on devices of its own, generating ahead of the training (module docstring).

    ``version``: the steps the trainer's weights have trained; ``engine_version``: the engines' (None before the
    first transfer); ``trained_position``: the prompt stream's state after the latest prompt drawn by a trained
    chunk, which the checkpoint saves. Metrics: ``async/staleness_mean`` and ``_max`` (version gap of the step's
    samples, from their oldest token), ``async/staleness_gap_<g>`` (samples of gap ``g``), ``async/token_gap_<g>``
    (response tokens of gap ``g``), ``async/partial_samples`` (samples whose tokens span several versions),
    ``async/dropped_groups`` (past ``max_staleness``), ``async/train_idle_s`` (trainer waited),
    ``async/rollout_idle_s`` (engines without a request since the last step), ``rollout/slot_occupancy``,
    ``timing_s/weight_transfer``, ``async/train_tokens_per_s`` (the step's tokens over the trainer's busy seconds).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        data, one_step = self.config.data, self.config.trainer.rollout_mode == "one_step_off"
        self.max_staleness = ONE_STEP if one_step else self.config.trainer.max_staleness
        self.chunk_groups = data.rollout_batch_size if one_step else data.generation_batch_size
        self.rollout_workers: Optional[WorkerGroup] = None
        self.streaming: Optional[StreamingRollout] = None  # the engines' request stream, set with the workers
        self.version = 0
        self.engine_version: Optional[int] = None
        self.trained_position: Optional[dict[str, Any]] = None
        self.plan = None  # the transfer's buckets (easyrl.workers.weight_transfer.Plan)
        self._cond = threading.Condition()  # guards the fields below
        self._done: dict[int, Chunk] = {}  # finished chunks by start order
        self._producer: Optional[threading.Thread] = None
        self._chunks: list[threading.Thread] = []
        self._started = self._taken = 0  # chunks started / taken by a step since the producer started
        self._made = self._start_step = 0  # chunks started and not dropped; the steps trained when it started
        self._stop = False
        self._failure: Optional[BaseException] = None
        self._trained_draw = -1
        self._transferred = 0.0  # seconds, of all transfers

    def init_workers(self, device: str, worker_cls: type = FSDPWorker) -> None:
        """Start the trainer's workers (without engines), then the rollout engines (``RolloutWorker`` or
        ``worker_cls.split_rollout_cls``), each in a placement group of its own, joined by the transfer group; the
        generator samples through their request stream."""
        cfg = self.config
        self.workers = WorkerGroup(cfg, device, worker_cls=worker_cls, training_steps=self.training_steps)
        rollout_cls = getattr(worker_cls, "split_rollout_cls", RolloutWorker)
        self.rollout_workers = WorkerGroup(cfg, device, worker_cls=rollout_cls,
                                           world_size=cfg.trainer.nnodes * cfg.worker.rollout.n_gpus_per_node,
                                           beside=self.workers.world_size)
        self.workers.peers.append(self.rollout_workers)
        for phase, seconds in self.rollout_workers.startup_seconds.items():
            self.workers.startup_seconds[phase] = max(seconds, self.workers.startup_seconds.get(phase, 0.0))
        # each engine's decode slots: a batch's samples spread over the engines, as a colocated step has them
        slots = max(1, cfg.data.rollout_batch_size * cfg.worker.rollout.n // self.rollout_workers.rollout_dp_size)
        self.streaming = StreamingRollout(lambda: RequestStream(self.rollout_workers, slots),
                                          cfg.data.max_response_length, self.pad_id)
        self._init_parts(self.rollout_workers, rollout=self.streaming)
        address, port = self.workers.run_all(FSDPWorker.address)[0]
        size = 1 + self.rollout_workers.world_size
        gather(self.workers.submit_all(FSDPWorker.join_transfer, address, port, size)
               + self.rollout_workers.submit_all(RolloutWorker.join_transfer, address, port, size), "join_transfer")
        self.plan = self.workers.run_all(FSDPWorker.transfer_plan)[0]

    def sync_rollout(self) -> float:
        """Send the trainer's weights to the engines, their requests in flight paused and kept (they continue on the
        new weights); returns the seconds taken."""
        with self.streaming.paused():
            refs = (self.workers.submit_all(FSDPWorker.send_weights, self.plan)
                    + self.rollout_workers.submit_all(RolloutWorker.receive_weights, self.plan, self.version))
            seconds = max(gather(refs, "send_weights/receive_weights"))
            self.engine_version = self.version
        return seconds

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
        stream = self.streaming.stream if self.streaming is not None else None
        while True:
            if stream is not None:
                stream.wait_below(stream.slots * self.rollout_workers.rollout_dp_size)
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

    def _stop_producer(self) -> None:
        """Stop the producer, drop the requests in flight and forget the chunks generated ahead."""
        if self._producer is not None:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            if self.streaming is not None:
                self.streaming.close()  # the chunks waiting for their samples are cancelled
            self._producer.join()
            for thread in self._chunks:
                thread.join()
        self._producer, self._chunks, self._stop, self._failure = None, [], False, None
        self._made = self._started = self._taken = 0
        self._trained_draw = -1
        self._done.clear()

    # ------------------------------------------------------------------------------------------ the trainer
    def _transfer(self) -> float:
        """Send new weights now (requests in flight kept); returns the seconds taken."""
        if self.engine_version == self.version:
            return 0.0
        seconds = self.sync_rollout()
        with self._cond:
            self._transferred += seconds
            self._cond.notify_all()
        return seconds

    def next_batch(self, prompt_stream: Iterator[dict[str, list]], timing: dict[str, float],
                   metrics: dict[str, float]) -> tuple[Batch, Any, dict[str, list[float]], int]:
        """This step's batch, from the chunks generated ahead in the order they started (dropping those past
        ``max_staleness``), tagged per sample with ``weight_version`` and ``version_gap``; sends the weights first
        (see the module docstring)."""
        waited = time.perf_counter()
        timing["weight_transfer"] = self._transfer()
        if self._producer is None:
            self._start_step = self.global_step - 1
            draws = Draws(prompt_stream, self.train_dataloader.state_dict)
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
        if self.streaming is not None:
            metrics["async/rollout_idle_s"] = self.streaming.stream.take_idle_seconds()
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

    def train_step(self, prompt_stream: Iterator[dict[str, list]]) -> dict[str, float]:
        """The colocated step over :meth:`next_batch`'s batch; the trainer's weights are then one version newer."""
        metrics = super().train_step(prompt_stream)
        self.version += 1
        busy = metrics["timing_s/step"] - metrics["async/train_idle_s"] - metrics["timing_s/weight_transfer"]
        metrics["async/train_tokens_per_s"] = metrics["perf/total_num_tokens"] / max(busy, 1e-9)
        return metrics

    def fit(self) -> None:
        """``RayPPOTrainer.fit``, then the producer stops (its chunks ahead are dropped)."""
        try:
            super().fit()
        finally:
            self._stop_producer()

    def state_dict(self) -> dict[str, Any]:
        """``RayPPOTrainer.state_dict`` at the prompt position of the last trained batch (``trained_position``)."""
        state = super().state_dict()
        if self.trained_position is not None:
            state["prompt_stream"] = self.trained_position
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """``RayPPOTrainer.load_state_dict``; chunks generated ahead are dropped, the engines get the loaded weights."""
        self._stop_producer()
        super().load_state_dict(state)
        self.version, self.engine_version, self.trained_position = self.global_step, None, state["prompt_stream"]
