"""A rank of the rollout engines alone, on a device of its own (``trainer.rollout_mode: one_step_off`` or ``async``):
the vLLM engine of an ``FSDPWorker`` without its model roles, which receives the trainer's weights over the transfer
group (``easyrl.workers.weight_transfer``) instead of from an actor in its process."""

from __future__ import annotations

import time

from easyrl.workers import weight_transfer
from easyrl.workers.fsdp_model import TORCH_DTYPES
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.weight_sync import check_all_loaded


class RolloutWorker(FSDPWorker):
    """``FSDPWorker``'s rollout methods (``generate_sequences``) over an engine that keeps its device (it never sleeps)
    and whose weights arrive by :meth:`receive_weights`; the trainer's methods (log-probs, updates) are not used."""

    trains = False  # no model roles: its WorkerGroup lays out no sequence-parallel groups (group.data_layout)

    def init_models(self) -> dict[str, float]:
        """Build the vLLM engine only (after the engine's memory pre-flight); returns the start-up seconds
        (``imports``, ``vllm_import``, ``engine``)."""
        if self.device != "cpu":
            self.check_memory("rollout")
        self.init_engine()
        return self.startup_seconds

    def _ensure_rollout_weights(self) -> float:
        """The weights are received, not synced here (0 s).

        Raises:
            RuntimeError: nothing was received yet (the engine holds its start-up dummy weights)."""
        if not self.rollout.holds_weights:
            raise RuntimeError("the rollout engine has not received the trainer's weights yet (receive_weights)")
        return 0.0

    def sleep_rollout(self) -> None:
        """No-op: the engine has its device to itself."""

    def join_transfer(self, address: str, port: int, size: int) -> None:
        """Join the transfer group as its rank ``1 + rank`` (``weight_transfer.open_group``)."""
        self.transfer = weight_transfer.open_group(address, port, 1 + self.rank, size, self.device,
                                                   self.config.worker.nccl_timeout)

    def receive_weights(self, plan: weight_transfer.Plan, version: int) -> float:
        """Load the trainer's weights (sent by ``FSDPWorker.send_weights`` along ``plan``) into the engine in place,
        requests in flight kept (their later tokens are of ``version``: a partial rollout, ``RequestEngine.reload``);
        returns the seconds taken.

        Raises:
            RuntimeError: a vLLM parameter was not written (``weight_sync.check_all_loaded`` names it)."""
        start = time.perf_counter()
        self.rollout.wake_up()
        dtype = TORCH_DTYPES[self.config.worker.rollout.dtype]
        expected, loaded = self.rollout.load_weights(weight_transfer.receive(self.transfer, plan, self.torch_device,
                                                                             dtype), version=version)
        check_all_loaded(set(expected), set(loaded))
        return time.perf_counter() - start
