"""``trainer.rollout_mode: one_step_off``: the rollout engines run on devices of their own (``RolloutWorker``s,
``worker.rollout.n_gpus_per_node``) and generate step t+1's batch while the trainer's workers (FSDP2 only) train on
step t's (docs/async.md).

Each step (``next_batch``, then the colocated step's phases on the trainer's workers)::

    wait for this step's batch (generated during the last step; the first step's now) -> tag it with the weight version
    that sampled it -> send the trainer's weights to the engines (they are idle: between two generations) -> start
    generating the next step's batch in the background -> train on this one

So the first batch is sampled by the start weights (version gap 0) and every later one by the weights one update
older than those it trains (gap 1, ``ONE_STEP``). The behaviour log-probs are vLLM's (``rollout_log_probs``); the
importance-sampling corrections (``worker.actor.rollout_is`` / ``tis_cap`` / ``rollout_rs``) apply to them unchanged,
and the weight-sync check is off (``PPOConfig.sync_check_threshold``: vLLM's log-probs are of older weights).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

from easyrl.batch import Batch
from easyrl.trainer.ray_trainer import RayPPOTrainer
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.group import WorkerGroup, gather
from easyrl.workers.rollout_worker import RolloutWorker

ONE_STEP = 1
"""The largest version gap of a trained sample in this mode."""


@dataclass
class Ahead:
    """A batch being generated in the background: ``future`` of ``(make_batch's result, its timing, its metrics, the
    perf_counter when it ended)``; ``version``: the weights sampling it; ``started``: perf_counter at its start."""

    future: Future
    version: int
    started: float


class OneStepOffTrainer(RayPPOTrainer):
    """``RayPPOTrainer`` with the rollout on devices of its own, one step ahead of the training (module docstring).

    ``version``: the updates the trainer's weights have had (= steps trained); ``engine_version``: the version the
    engines hold (None before the first transfer). Metrics beside the colocated ones: ``async/staleness_mean`` and
    ``_max`` (version gap of the step's samples), ``async/train_idle_s`` (the trainer waited for the batch),
    ``async/rollout_idle_s`` (the engines neither generated nor received weights, from the end of this batch's
    generation to the start of the next one), ``timing_s/weight_transfer``, ``async/train_tokens_per_s`` (the step's
    tokens over the trainer's busy seconds; the engines' rate is ``perf/rollout_tokens_per_s``).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rollout_workers: Optional[WorkerGroup] = None
        self.version = 0
        self.engine_version: Optional[int] = None
        self.plan = None  # the transfer's buckets (easyrl.workers.weight_transfer.Plan)
        self._ahead: Optional[Ahead] = None
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="easyrl-rollout")

    def init_workers(self, device: str, worker_cls: type = FSDPWorker) -> None:
        """Start the trainer's workers (``worker_cls``, without engines), then the rollout engines (``RolloutWorker``,
        or ``worker_cls.split_rollout_cls`` where a test's worker names one), each in a placement group of its own,
        and join them by the transfer group (``easyrl.workers.weight_transfer``)."""
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
        """Send the trainer's weights to the engines (both groups at once; call it between two generations); returns
        the seconds taken."""
        refs = (self.workers.submit_all(FSDPWorker.send_weights, self.plan)
                + self.rollout_workers.submit_all(RolloutWorker.receive_weights, self.plan))
        seconds = max(gather(refs, "send_weights/receive_weights"))
        self.engine_version = self.version
        return seconds

    def _generate_ahead(self, prompt_stream: Iterator[dict[str, list]], step: int) -> Ahead:
        def run() -> tuple[tuple, dict[str, float], dict[str, float], float]:
            timing: dict[str, float] = {}
            metrics: dict[str, float] = {}
            made = self.generator.make_batch(prompt_stream, step, timing, metrics)
            return made, timing, metrics, time.perf_counter()

        return Ahead(self._background.submit(run), self.engine_version, time.perf_counter())

    def next_batch(self, prompt_stream: Iterator[dict[str, list]], timing: dict[str, float],
                   metrics: dict[str, float]) -> tuple[Batch, Any, dict[str, list[float]], int]:
        """This step's batch, generated during the last step (the first step's now), tagged per sample with
        ``weight_version`` and ``version_gap``; starts the next step's generation (see the module docstring)."""
        if self._ahead is None:
            timing["weight_transfer"] = self.sync_rollout()
            self._ahead = self._generate_ahead(prompt_stream, self.global_step)
        ahead, waited = self._ahead, time.perf_counter()
        (batch, pending, generated, failures), gen_timing, gen_metrics, ended = ahead.future.result()
        metrics["async/train_idle_s"] = time.perf_counter() - waited
        timing.update(gen_timing)
        metrics.update(gen_metrics)
        gap = self.version - ahead.version
        if not 0 <= gap <= ONE_STEP:
            raise RuntimeError(f"a batch sampled by weight version {ahead.version} would train version {self.version}:"
                               f" a gap of {gap}, beyond one_step_off's {ONE_STEP}")
        batch["weight_version"] = [ahead.version] * len(batch)
        batch["version_gap"] = [gap] * len(batch)
        metrics["async/staleness_mean"] = float(sum(batch["version_gap"]) / len(batch))
        metrics["async/staleness_max"] = float(max(batch["version_gap"]))
        self._ahead = None
        if self.global_step < self.training_steps:  # the next step's batch, by the weights this step starts from
            transfer = self.sync_rollout() if self.engine_version != self.version else 0.0
            timing["weight_transfer"] = timing.get("weight_transfer", 0.0) + transfer
            self._ahead = self._generate_ahead(prompt_stream, self.global_step + 1)
            metrics["async/rollout_idle_s"] = max(self._ahead.started - ended - transfer, 0.0)
        return batch, pending, generated, failures

    def train_step(self, prompt_stream: Iterator[dict[str, list]]) -> dict[str, float]:
        """The colocated step over :meth:`next_batch`'s batch; the trainer's weights are then one version newer."""
        metrics = super().train_step(prompt_stream)
        if self.actor_updates_this_step():
            self.version += 1
        busy = metrics["timing_s/step"] - metrics["async/train_idle_s"] - metrics.get("timing_s/weight_transfer", 0.0)
        metrics["async/train_tokens_per_s"] = metrics["perf/total_num_tokens"] / max(busy, 1e-9)
        return metrics
