"""Where the rollout engines run (a part the trainer holds, chosen once from ``config.placement``): ``Colocated`` on the
trainer's workers, ``Split`` on devices of their own, or nowhere: ``TrainOnly``, a replay of a rollout dump. Each starts
its worker groups and makes the rollout and the batch source (``easyrl.trainer.batch_source``) that fit it."""

from __future__ import annotations

from typing import Any, Callable, Union

from easyrl.config import PPOConfig
from easyrl.trainer.async_rollout import AheadBatches
from easyrl.trainer.batch_source import BatchSource, OnPolicyBatches, ReplayBatches
from easyrl.trainer.generation import Generator
from easyrl.trainer.multi_turn import make_rollout
from easyrl.trainer.request_stream import RequestStream, StreamingRollout
from easyrl.trainer.rollout import Rollout
from easyrl.trainer.scoring import Scorer
from easyrl.workers.fsdp_worker import FSDPWorker, Parts
from easyrl.workers.group import WorkerGroup, gather

__all__ = ["Colocated", "NoRollout", "Split", "TrainOnly", "start_placement"]


class Colocated:
    """The engines on the trainer's workers (``workers`` is ``engines``): each rank trains and generates in turn, its
    engine fed the actor's weights in place before it generates."""

    def __init__(self, config: PPOConfig, device: str, worker_cls: type, training_steps: int, pad_id: int):
        self.config, self.pad_id = config, pad_id
        self.workers = self.engines = WorkerGroup(config, device, worker_cls=worker_cls,
                                                  training_steps=training_steps)

    def rollout(self, tokenizer: Any, dataset: Any) -> Rollout:
        """The configured rollout (``make_rollout``) on the workers' engines."""
        return make_rollout(self.config, self.workers, tokenizer, self.pad_id, dataset)

    def batches(self, generator: Generator, scorer: Scorer, position: Callable[[], Any],
                training_steps: int) -> BatchSource:
        """Each step's batch generated when it starts."""
        return OnPolicyBatches(generator)

    def close(self) -> None:
        """Nothing of its own to stop."""


class Split:
    """The engines on devices of their own: ``workers`` (the model roles, no engine) and ``engines`` (engine-only
    workers placed beside them), joined by the transfer group; the engines are driven request by request through one
    shared ``RequestStream`` (``stream``), which every rollout on them (single- or multi-turn, validation) submits to."""

    def __init__(self, config: PPOConfig, device: str, worker_cls: type, training_steps: int, pad_id: int):
        self.config, self.pad_id = config, pad_id
        self.workers = WorkerGroup(config, device, worker_cls=worker_cls, training_steps=training_steps,
                                   parts=Parts(engine=False))
        self.engines = WorkerGroup(config, device, worker_cls=worker_cls, world_size=config.placement.engine_devices,
                                   beside=self.workers.world_size, parts=Parts(models=False))
        self.workers.peers.append(self.engines)  # shut down with the trainer's workers
        for phase, seconds in self.engines.startup_seconds.items():
            self.workers.startup_seconds[phase] = max(seconds, self.workers.startup_seconds.get(phase, 0.0))
        # each engine's decode slots: a batch's samples spread over the engines, as a colocated step has them
        data = config.data
        slots = max(1, data.rollout_batch_size * config.worker.rollout.n // self.engines.rollout_dp_size)
        self.streaming = StreamingRollout(lambda: RequestStream(self.engines, slots), data.max_response_length, pad_id)
        address, port = self.workers.run_all(FSDPWorker.address)[0]
        size = 1 + self.engines.world_size
        gather(self.workers.submit_all(FSDPWorker.join_transfer, address, port, size)
               + self.engines.submit_all(FSDPWorker.join_transfer, address, port, size), "join_transfer")
        self.plan = self.workers.run_all(FSDPWorker.transfer_plan)[0]  # the transfer's buckets

    @property
    def stream(self) -> RequestStream:
        """The engines' request stream (opened now if none is open)."""
        return self.streaming.stream

    def close_stream(self) -> None:
        """Close the request stream: its requests are dropped, its waiting submissions cancelled."""
        self.streaming.close()

    def rollout(self, tokenizer: Any, dataset: Any) -> Rollout:
        """The configured rollout on the shared stream: ``StreamingRollout``, or a ``MultiTurnRollout`` or
        ``AgentRollout`` whose turns or requests it submits."""
        rollout = self.config.worker.rollout
        if rollout.multi_turn.enable or rollout.agent.enabled:
            return make_rollout(self.config, self.engines, tokenizer, self.pad_id, dataset, stream=lambda: self.stream)
        return self.streaming

    def batches(self, generator: Generator, scorer: Scorer, position: Callable[[], Any],
                training_steps: int) -> BatchSource:
        """Batches generated ahead (``AheadBatches``), within the placement's staleness bound."""
        return AheadBatches(self.config, generator, scorer, self, position, training_steps)

    def send_weights(self, version: int) -> float:
        """Send the trainer's weights (``version`` steps trained) to the engines, their requests in flight paused and
        kept (they continue on the new weights); returns the seconds taken."""
        with self.streaming.paused():
            refs = (self.workers.submit_all(FSDPWorker.send_weights, self.plan)
                    + self.engines.submit_all(FSDPWorker.receive_weights, self.plan, version))
            return max(gather(refs, "send_weights/receive_weights"))

    def close(self) -> None:
        """Close the request stream."""
        self.close_stream()


class NoRollout:
    """The rollout of a placement without engines: nothing to generate with."""

    engines = 1

    def generate(self, prompts: Any, overrides: Any) -> tuple[Any, float]:
        """Raises ``RuntimeError``: a replay has no engines (it reads its batches from the dump)."""
        raise RuntimeError("a replay (trainer.load_rollout_data_dir) has no rollout engines to generate with")

    def slot_occupancy(self) -> None:
        """None: no decode slots."""
        return None

    def close(self) -> None:
        """Nothing runs in the background."""


class TrainOnly:
    """No engines (a replay of a rollout dump, ``trainer.load_rollout_data_dir``): the trainer's workers hold the
    model roles alone (``Parts(engine=False)``), and each step's batch is read from the dump (``ReplayBatches``)."""

    def __init__(self, config: PPOConfig, device: str, worker_cls: type, training_steps: int, pad_id: int):
        self.config, self.pad_id = config, pad_id
        self.workers = WorkerGroup(config, device, worker_cls=worker_cls, training_steps=training_steps,
                                   parts=Parts(engine=False))
        self.engines = None

    def rollout(self, tokenizer: Any, dataset: Any) -> NoRollout:
        """A rollout that cannot generate (``NoRollout``)."""
        return NoRollout()

    def batches(self, generator: Generator, scorer: Scorer, position: Callable[[], Any],
                training_steps: int) -> BatchSource:
        """The dump's batches, step by step (``ReplayBatches``)."""
        return ReplayBatches(self.config.trainer.load_rollout_data_dir)

    def close(self) -> None:
        """Nothing of its own to stop."""


def start_placement(config: PPOConfig, device: str, worker_cls: type = FSDPWorker, training_steps: int = 0,
                    pad_id: int = 0) -> Union[Colocated, Split, TrainOnly]:
    """Start the workers of ``config.placement`` (``worker_cls``: ``FSDPWorker`` or a subclass; ``pad_id`` pads the
    rollout's responses)."""
    placement = config.placement
    cls = TrainOnly if not placement.engines else Split if placement.split else Colocated
    return cls(config, device, worker_cls, training_steps, pad_id)

