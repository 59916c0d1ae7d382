"""The weights from the trainer's FSDP2 ranks to rollout engines on devices of their own (``trainer.rollout_mode:
one_step_off`` or ``async``): the split-placement counterpart of ``easyrl.workers.weight_sync``.

Per bucket of one ``plan`` (made by trainer rank 0, handed to both sides) the trainer ranks all-gather the full tensors
and rank 0 broadcasts them as one flat buffer; the rollout ranks hand them to vLLM (one ``reload_weights``) and check
every parameter was written. The transfer group (trainer rank 0, then rollout rank ``r`` as ``1 + r``) has its own
store, outside torch.distributed's registry, so the collective contract does not compare its two sides.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from easyrl.workers.weight_sync import gather_bucket, plan_buckets

Plan = list[list[tuple[str, list[int]]]]
"""Buckets, in order, of ``(Hugging Face name, full shape)``."""


def open_group(address: str, port: int, rank: int, size: int, device: str, timeout_s: int) -> Any:
    """This process's member of the transfer group (``size`` ranks; rank 0, the trainer's rank 0, hosts its store at
    ``address:port``); every member calls it at the same time. ``device``: ``cpu`` (gloo), ``cuda`` (NCCL) or ``npu``
    (HCCL, through torch_npu); ``timeout_s``: ``worker.nccl_timeout``."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.PrefixStore("easyrl_transfer/", dist.TCPStore(address, port, size, rank == 0, timeout=timeout))
    if device == "cpu":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    if device == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # untested here: no NPU on the CI machine

    options = ProcessGroupHCCL.Options()
    options._timeout = timeout
    return ProcessGroupHCCL(store, rank, size, options)


def make_plan(state: dict[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int) -> Plan:
    """The buckets of the actor's ``state`` (its ``state_dict()``: HF names, full shapes) as the colocated sync makes
    them (``weight_sync.plan_buckets`` over the full-tensor bytes in ``dtype``)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    buckets = plan_buckets([(name, t.numel() * itemsize) for name, t in state.items()], bucket_bytes)
    return [[(name, list(state[name].shape)) for name in names] for names in buckets]


def _broadcast(group: Any, flat: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    group.broadcast([flat], options).wait()


def send(group: Optional[Any], state: dict[str, torch.Tensor], plan: Plan, device: torch.device,
         dtype: torch.dtype) -> None:
    """Every trainer rank: gather each bucket of ``plan`` from ``state`` (collective over the trainer's ranks); the
    trainer's rank 0 (``group`` its transfer group; None on the other ranks) broadcasts it flat to the rollout ranks."""
    for bucket in plan:
        fulls = gather_bucket([state[name] for name, _ in bucket], device, dtype)
        if group is not None:
            _broadcast(group, torch.cat([t.reshape(-1) for t in fulls]))
        del fulls


def receive(group: Any, plan: Plan, device: torch.device, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """A rollout rank: ``(HF name, full tensor)`` pairs of ``plan``, each bucket received (one broadcast) when the
    consumer reaches it."""
    for bucket in plan:
        flat = torch.empty(sum(math.prod(shape) for _, shape in bucket), dtype=dtype, device=device)
        _broadcast(group, flat)
        offset = 0
        for name, shape in bucket:
            numel = math.prod(shape)
            yield name, flat[offset: offset + numel].view(shape)
            offset += numel
        del flat
