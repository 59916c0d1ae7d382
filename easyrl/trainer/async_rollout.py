"""``trainer.rollout_mode: one_step_off`` and ``async``: the rollout engines run on devices of their own
(``RolloutWorker``s, ``worker.rollout.n_gpus_per_node``) and keep generating while the trainer's workers train
(docs/async.md).

A producer thread generates *chunks* (one ``Generator.make_batch`` call each: ``data.mini_rollout_batch_size`` prompt
groups in ``async``, ``data.rollout_batch_size`` one step off), tags each with the engines' weight version and queues
it; each step takes chunks until its batch is full. Staleness is bounded as in AReaL (Fu et al. 2025,
arXiv:2505.24298, sec. 4.2): a chunk starts only if the step that will train it is at most ``trainer.max_staleness``
versions (one step off: 1) past the engines' weights, so the queue holds at most ``max_staleness + 1`` batches. Each
step first sends the new weights at the next chunk boundary (in-flight requests finish on the old weights and are
tagged so: no partial rollouts).

The behaviour log-probs are vLLM's (``rollout_log_probs``); the importance-sampling corrections apply to them
unchanged, and the weight-sync check is off (vLLM's log-probs are of older weights).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

from easyrl.batch import Batch
from easyrl.trainer.ray_trainer import RayPPOTrainer
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


@dataclass
class Chunk:
    """One ``make_batch`` call's groups: ``made`` its ``(batch, scores, failures)`` (scored), ``version`` the
    weights that sampled it, ``position`` the prompt stream's state after its prompts, ``timing`` (seconds) and
    ``metrics`` of its generation."""

    made: tuple[Batch, dict[str, list[float]], int]
    version: int
    position: dict[str, Any]
    timing: dict[str, float]
    metrics: dict[str, float]


class AsyncRolloutTrainer(RayPPOTrainer):
    """``RayPPOTrainer`` with the rollout on devices of its own, generating ahead of the training (module docstring).

    ``version``: the steps the trainer's weights have trained; ``engine_version``: the engines' (None before the
    first transfer); ``trained_position``: the prompt stream's state after the last batch taken, which the checkpoint
    saves. Metrics: ``async/staleness_mean`` and ``_max`` (version gap of the step's samples),
    ``async/staleness_gap_<g>`` (samples of gap ``g``), ``async/dropped_groups`` (past ``max_staleness``),
    ``async/train_idle_s`` (trainer waited), ``async/rollout_idle_s`` (engines idle since the last step),
    ``timing_s/weight_transfer``, ``async/train_tokens_per_s`` (the step's tokens over the trainer's busy seconds).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        data, one_step = self.config.data, self.config.trainer.rollout_mode == "one_step_off"
        self.max_staleness = ONE_STEP if one_step else self.config.trainer.max_staleness
        self.chunk_groups = data.rollout_batch_size if one_step else data.generation_batch_size
        self.rollout_workers: Optional[WorkerGroup] = None
        self.version = 0
        self.engine_version: Optional[int] = None
        self.trained_position: Optional[dict[str, Any]] = None
        self.plan = None  # the transfer's buckets (easyrl.workers.weight_transfer.Plan)
        self._cond = threading.Condition()  # guards the fields below and the engines' weights
        self._queue: deque[Chunk] = deque()
        self._producer: Optional[threading.Thread] = None
        self._made = self._start_step = 0  # chunks started since the producer started (dropped ones not counted),
        # the steps trained then
        self._busy = self._stop = False  # a chunk is generating; the producer is asked to stop
        self._failure: Optional[BaseException] = None
        self._rollout_idle = self._transferred = 0.0  # seconds, since the last step; of all transfers

    def init_workers(self, device: str, worker_cls: type = FSDPWorker) -> None:
        """Start the trainer's workers (without engines), then the rollout engines (``RolloutWorker`` or
        ``worker_cls.split_rollout_cls``), each in a placement group of its own, joined by the transfer group."""
        cfg = self.config
        self.workers = WorkerGroup(cfg, device, worker_cls=worker_cls, training_steps=self.training_steps)
        rollout_cls = getattr(worker_cls, "split_rollout_cls", RolloutWorker)
        self.rollout_workers = WorkerGroup(cfg, device, worker_cls=rollout_cls,
                                           world_size=cfg.trainer.nnodes * cfg.worker.rollout.n_gpus_per_node,
                                           beside=self.workers.world_size)
        self.workers.peers.append(self.rollout_workers)
        for phase, seconds in self.rollout_workers.startup_seconds.items():
            self.workers.startup_seconds[phase] = max(seconds, self.workers.startup_seconds.get(phase, 0.0))
        self._init_parts(self.rollout_workers)
        address, port = self.workers.run_all(FSDPWorker.address)[0]
        size = 1 + self.rollout_workers.world_size
        gather(self.workers.submit_all(FSDPWorker.join_transfer, address, port, size)
               + self.rollout_workers.submit_all(RolloutWorker.join_transfer, address, port, size), "join_transfer")
        self.plan = self.workers.run_all(FSDPWorker.transfer_plan)[0]

    def sync_rollout(self) -> float:
        """Send the trainer's weights to the engines (between two chunks); returns the seconds taken."""
        refs = (self.workers.submit_all(FSDPWorker.send_weights, self.plan)
                + self.rollout_workers.submit_all(RolloutWorker.receive_weights, self.plan))
        seconds = max(gather(refs, "send_weights/receive_weights"))
        self.engine_version = self.version
        return seconds

    # ----------------------------------------------------------------------------------------- the producer
    def _next_step(self) -> int:
        return chunk_step(self._made, self.chunk_groups, self.config.data.rollout_batch_size, self._start_step)

    def _may_start(self) -> bool:
        step = self._next_step()
        return self._stop or (step <= self.training_steps and within_staleness(step - 1, self.engine_version,
                                                                              self.max_staleness))

    def _produce(self, prompt_stream: Iterator[dict[str, list]]) -> None:
        """The producer thread: chunk after chunk while the staleness bound allows, until asked to stop."""
        per_step = self.config.data.rollout_batch_size // self.chunk_groups
        try:
            while True:
                with self._cond:
                    began, transferred = time.perf_counter(), self._transferred
                    self._cond.wait_for(self._may_start)
                    if self._stop:
                        return
                    self._rollout_idle += time.perf_counter() - began - (self._transferred - transferred)
                    step, version, index = self._next_step(), self.engine_version, self._made
                    self._made, self._busy = self._made + 1, True
                timing: dict[str, float] = {}
                metrics: dict[str, float] = {}
                batch, pending, scores, failures = self.generator.make_batch(
                    prompt_stream, step, timing, metrics, groups=self.chunk_groups, first_round=index % per_step)
                if pending is not None:  # scored in the reward actor: the chunk is queued scored
                    failures += self.scorer.wait(batch, pending, list(range(len(batch))))
                chunk = Chunk((batch, scores, failures), version, self.train_dataloader.state_dict(), timing, metrics)
                with self._cond:
                    self._queue.append(chunk)
                    self._busy = False
                    self._cond.notify_all()
        except BaseException as err:  # handed to the trainer's thread (next_batch raises it)
            with self._cond:
                self._failure, self._busy = err, False
                self._cond.notify_all()

    def _stop_producer(self) -> None:
        """Stop the producer after its chunk in flight and forget the chunks generated ahead."""
        if self._producer is not None:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            self._producer.join()
        self._producer, self._made, self._stop, self._failure = None, 0, False, None
        self._queue.clear()

    # ------------------------------------------------------------------------------------------ the trainer
    def _transfer(self) -> float:
        """Send new weights at the next chunk boundary (no chunk starts meanwhile); returns the seconds taken."""
        if self.engine_version == self.version:
            return 0.0
        with self._cond:
            self._cond.wait_for(lambda: not self._busy)
            seconds = self.sync_rollout()
            self._transferred += seconds
            self._cond.notify_all()
        return seconds

    def next_batch(self, prompt_stream: Iterator[dict[str, list]], timing: dict[str, float],
                   metrics: dict[str, float]) -> tuple[Batch, Any, dict[str, list[float]], int]:
        """This step's batch, from the chunks generated ahead (dropping those past ``max_staleness``), tagged per
        sample with ``weight_version`` and ``version_gap``; sends the weights first (see the module docstring)."""
        waited = time.perf_counter()
        timing["weight_transfer"] = self._transfer()
        if self._producer is None:
            self._start_step = self.global_step - 1
            self._producer = threading.Thread(target=self._produce, args=(prompt_stream,), name="easyrl-rollout",
                                              daemon=True)
            self._producer.start()
        chunks, dropped = [], 0
        with self._cond:
            while len(chunks) * self.chunk_groups < self.config.data.rollout_batch_size:
                self._cond.wait_for(lambda: self._queue or self._failure is not None)
                if self._failure is not None:
                    raise self._failure
                chunk = self._queue.popleft()
                if within_staleness(self.version, chunk.version, self.max_staleness):
                    chunks.append(chunk)
                else:  # the producer makes one more in its place
                    dropped, self._made = dropped + self.chunk_groups, self._made - 1
                    self._cond.notify_all()
            metrics["async/rollout_idle_s"], self._rollout_idle = self._rollout_idle, 0.0
        metrics["async/train_idle_s"] = time.perf_counter() - waited - timing["weight_transfer"]
        self.trained_position = chunks[-1].position
        generated: dict[str, list[float]] = defaultdict(list)
        for chunk in chunks:
            for table, values in ((timing, chunk.timing), (metrics, chunk.metrics), (generated, chunk.made[1])):
                for key, value in values.items():
                    table[key] = table.get(key, type(value)()) + value
        batch = Batch.cat([chunk.made[0] for chunk in chunks])
        batch["weight_version"] = [c.version for c in chunks for _ in range(len(c.made[0]))]
        batch["version_gap"] = gaps = [self.version - version for version in batch["weight_version"]]
        metrics["async/staleness_mean"], metrics["async/staleness_max"] = sum(gaps) / len(gaps), float(max(gaps))
        metrics.update({f"async/staleness_gap_{g}": float(gaps.count(g)) for g in range(self.max_staleness + 1)})
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
