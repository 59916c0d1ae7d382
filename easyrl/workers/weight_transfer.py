"""The weights from the trainer's FSDP2 ranks to rollout engines on devices of their own (``trainer.rollout_mode:
one_step_off`` or ``async``): the split-placement counterpart of ``easyrl.workers.weight_sync``.

Per bucket of one ``plan`` (made by trainer rank 0, handed to both sides) the trainer ranks all-gather the full tensors
and rank 0 broadcasts them as one flat buffer; the rollout ranks hand them to vLLM (one ``reload_weights``) and check
every parameter was written. Two buckets are in flight (``easyrl.config.worker.TRANSFER_BUCKETS_IN_FLIGHT``): a
bucket's broadcast overlaps the next one's gather and the previous one's load. The transfer group (trainer rank 0,
then rollout rank ``r`` as ``1 + r``) has its own store, outside torch.distributed's registry, so the collective
contract does not compare its two sides. With a LoRA adapter on the actor the plan's names and shapes are the merged
model's and rank 0 sends ``W + scale * B @ A``, merged per bucket by the colocated sync's
``easyrl.models.lora.merge_lora_stream``.

On NPUs the group is a sub-group by torch_npu's rules (:func:`hccl_options`): with empty ``global_ranks_in_group``
torch_npu makes a group the process's global one, and with ``RANK_TABLE_FILE`` set it builds such a group's
communicator from the cluster's rank table (torch_npu 2.10.0.post4, ``ProcessGroupHCCL.cpp``: the constructor's
``global_ = this``, ``createHCCLCommEx``), the wrong members for a group outside the trainer's world.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import deque
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from easyrl import envvars
from easyrl.config.worker import TRANSFER_BUCKETS_IN_FLIGHT
from easyrl.workers.weight_sync import gather_bucket, plan_buckets

Plan = list[list[tuple[str, list[int]]]]
"""Buckets, in order, of ``(Hugging Face name, full shape)``."""


def open_group(address: str, port: int, rank: int, size: int, device: str, timeout_s: int) -> Any:
    """This process's member of the transfer group (``size`` ranks; rank 0, the trainer's rank 0, hosts its store at
    ``address:port``); every member calls it at the same time. ``device``: ``cpu`` (gloo), ``cuda`` (NCCL) or ``npu``
    (HCCL, through torch_npu: a sub-group by :func:`hccl_options`, its communicator built by a one-element broadcast
    here with ``RANK_TABLE_FILE`` unset); ``timeout_s``: ``worker.nccl_timeout``.

    Raises:
        RuntimeError: on ``npu``, as :func:`hccl_options`."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.PrefixStore("easyrl_transfer/", dist.TCPStore(address, port, size, rank == 0, timeout=timeout))
    if device == "cpu":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    if device == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # not run here: no NPU on the CI machine

    options = ProcessGroupHCCL.Options()
    for field, value in hccl_options(size, port, timeout, os.environ).items():
        setattr(options, field, value)
    group = ProcessGroupHCCL(store, rank, size, options)
    # HCCL builds the communicator at the first collective: now, from root info
    with envvars.replaced(os.environ, RANK_TABLE_ENV, None):
        _broadcast(group, torch.zeros(1, device="npu"))
    return group


RANK_TABLE_ENV = "RANK_TABLE_FILE"
"""torch_npu builds a group's communicator from this rank table when it is set and readable; unset while the
transfer group's is built."""


def hccl_options(size: int, port: int, timeout: timedelta, environ: Mapping[str, str]) -> dict[str, Any]:
    """The fields to set on torch_npu's ``ProcessGroupHCCL.Options`` for a transfer group of ``size`` ranks whose
    store listens on ``port``: those torch_npu's own ``_new_process_group_hccl_helper`` sets
    (``torch_npu/_init/registry/distributed.py``), ``is_high_priority_stream`` False, ``_timeout``,
    ``global_ranks_in_group`` (non-empty, the group's own ranks ``0 .. size - 1``: it has no world of its own, and an
    empty list would make it the process's global group) and ``group_id`` (the same on every member, one per port:
    torch_npu names the group and hashes sub-communicator ids from it).

    Raises:
        RuntimeError: ``ROOTINFO_SUBCOMM_ENABLE`` is on in ``environ`` (torch_npu would derive this group's
            communicator from the process's global group, of which the rollout ranks are no members)."""
    if envvars.rootinfo_subcomm(environ):
        raise RuntimeError("ROOTINFO_SUBCOMM_ENABLE is on: torch_npu would derive the trainer-to-rollout transfer "
                           "group's HCCL communicator from this process's global group, whose ranks are not the "
                           "group's; unset it (or set 0) in worker.env_vars for the split rollout modes.")
    return {"is_high_priority_stream": False, "_timeout": timeout, "global_ranks_in_group": list(range(size)),
            "group_id": f"easyrl_transfer_{port}"}


def make_plan(state: dict[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int,
              lora_scale: Optional[float] = None) -> Plan:
    """The buckets of the actor's ``state`` (its ``state_dict()``: full shapes) as the colocated sync makes them
    (``weight_sync.plan_buckets`` over the bytes in ``dtype`` of the full tensors each bucket gathers). With
    ``lora_scale`` (a peft LoRA adapter on the actor) the names and shapes are the merged model's, those of
    ``easyrl.models.lora.merge_lora_stream`` (run here on meta tensors: no memory), in its order, and a module's base
    weight and matrices always share a bucket.

    Raises:
        ValueError: ``bucket_bytes`` <= 0; with ``lora_scale``, a LoRA module without its base weight or matrices."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    if lora_scale is None:
        shapes = {name: list(t.shape) for name, t in state.items()}
    else:
        from easyrl.models.lora import merge_lora_stream

        meta = ((name, torch.empty(t.shape, dtype=dtype, device="meta")) for name, t in state.items())
        shapes = {name: list(t.shape) for name, t in merge_lora_stream(meta, lora_scale)}
    sources = _sources(state, lora_scale)
    sizes = [(name, sum(state[s].numel() for s in sources[name]) * itemsize) for name in shapes]
    return [[(name, shapes[name]) for name in names] for names in plan_buckets(sizes, bucket_bytes)]


def _sources(state: dict[str, torch.Tensor], lora_scale: Optional[float]) -> dict[str, list[str]]:
    """The names of ``state`` each plan name is made from (itself without LoRA; ``lora.merge_sources`` with)."""
    if lora_scale is None:
        return {name: [name] for name in state}
    from easyrl.models.lora import merge_sources

    return merge_sources(state)


def _post_broadcast(group: Any, flat: torch.Tensor) -> Any:
    """Start the broadcast of ``flat`` from the group's rank 0; returns its work (``wait()`` before reading or
    freeing ``flat``: on NCCL / HCCL it also orders the current stream after the collective)."""
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    return group.broadcast([flat], options)


def _broadcast(group: Any, flat: torch.Tensor) -> None:
    _post_broadcast(group, flat).wait()


def send(group: Optional[Any], state: dict[str, torch.Tensor], plan: Plan, device: torch.device,
         dtype: torch.dtype, lora_scale: Optional[float] = None) -> None:
    """Every trainer rank: gather each bucket of ``plan`` (from :func:`make_plan` with the same ``lora_scale``) from
    ``state`` (collective over the trainer's ranks); the trainer's rank 0 (``group`` its transfer group; None on the
    other ranks) broadcasts it as one flat ``dtype`` buffer, the plan's tensors in its order. With ``lora_scale``
    (``alpha / rank``) a module's base weight and matrices are merged into ``W + scale * B @ A`` after the gather
    (``easyrl.models.lora.merge_lora_stream``, as the colocated sync); held at once: one bucket's gathered tensors,
    ``TRANSFER_BUCKETS_IN_FLIGHT`` flat buffers (the one being filled, the ones still being broadcast) and one
    merge's float32 temporaries.

    Raises:
        ValueError: with ``lora_scale``, a LoRA module without its base weight or matrices.
        RuntimeError: ``state`` does not give the bucket's plan names and sizes (a plan of another model or mode)."""
    sources = _sources(state, lora_scale)
    in_flight: deque = deque()  # (work, flat) of the broadcasts posted and not yet waited for
    for bucket in plan:
        unknown = [name for name, _ in bucket if name not in sources]
        if unknown:
            raise RuntimeError(f"weight transfer: the plan's {unknown[:5]} are not made from the actor's state (a plan "
                               "of another model or LoRA setting)")
        names = [source for name, _ in bucket for source in sources[name]]
        fulls: Iterator[tuple[str, torch.Tensor]] = zip(names, gather_bucket([state[n] for n in names], device, dtype))
        if lora_scale is not None:
            from easyrl.models.lora import merge_lora_stream

            fulls = merge_lora_stream(fulls, lora_scale)
        slots, offset = {}, 0
        for name, shape in bucket:
            slots[name] = (offset, math.prod(shape))
            offset += math.prod(shape)
        flat = torch.empty(offset, dtype=dtype, device=device)
        for name, tensor in fulls:
            start, numel = slots.pop(name, (0, None))
            if numel != tensor.numel():
                raise RuntimeError(f"weight transfer: {name} {list(tensor.shape)} is not in the plan's bucket "
                                   "(the plan was made from another state or LoRA setting)")
            flat[start: start + numel].copy_(tensor.reshape(-1))
            del tensor
        if slots:
            raise RuntimeError(f"weight transfer: the state gave none of the plan's {sorted(slots)}")
        if group is not None:
            in_flight.append((_post_broadcast(group, flat), flat))
            while len(in_flight) >= TRANSFER_BUCKETS_IN_FLIGHT:  # the next gather overlaps this broadcast
                in_flight.popleft()[0].wait()
        del fulls, flat
    while in_flight:
        in_flight.popleft()[0].wait()


def receive(group: Any, plan: Plan, device: torch.device, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """A rollout rank: ``(HF name, full tensor)`` pairs of ``plan``, bucket by bucket (one broadcast each), the
    next ``TRANSFER_BUCKETS_IN_FLIGHT - 1`` buckets already being received while the consumer reads one; a bucket's
    tensors are views of its flat buffer, valid until the consumer asks for the next bucket's."""
    posted: deque = deque()  # (bucket, work, flat) in plan order

    def post(bucket: list[tuple[str, list[int]]]) -> None:
        flat = torch.empty(sum(math.prod(shape) for _, shape in bucket), dtype=dtype, device=device)
        posted.append((bucket, _post_broadcast(group, flat), flat))

    buckets = iter(plan)
    for bucket in itertools.islice(buckets, TRANSFER_BUCKETS_IN_FLIGHT):
        post(bucket)
    while posted:
        bucket, work, flat = posted.popleft()
        work.wait()
        offset = 0
        for name, shape in bucket:
            numel = math.prod(shape)
            yield name, flat[offset: offset + numel].view(shape)
            offset += numel
        del flat
        following = next(buckets, None)  # posted once the consumer is done with this bucket's views
        if following is not None:
            post(following)
