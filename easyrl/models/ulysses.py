"""Ulysses sequence parallelism (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509) on the packed layout.

A group's ``ulysses_size`` ranks share a micro-batch; its packed row is padded to a multiple of the group size and cut
into one slice per rank. Around attention an all-to-all swaps ``(1, heads, total / sp, d)`` <-> ``(1, heads / sp,
total, d)`` (paper, 3.1). Each rank scores its slice's response tokens; summing the scores over the group (whose
backward sums the ``sp`` gradient copies, undoing FSDP2's average over ``dp x sp`` ranks) equals a run without it.
Positions are computed on the whole row; a VL tower runs on every rank with the same images.

:func:`attention_name` registers the wrapped attention (active inside :meth:`SequenceParallel.sharded`, causal
only); :meth:`SequenceParallel.attach` hooks the text decoder to slice its inputs.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from easyrl.models.families import text_config

__all__ = ["SequenceParallel", "attention_name", "check_heads", "sequence_parallel_group", "init_sequence_parallel"]

_GROUP: Optional["SequenceParallel"] = None
_ACTIVE: Optional["_Shard"] = None


def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Chunk ``x`` along ``scatter_dim`` over the group's ranks, send chunk ``j`` to rank ``j``, concatenate what
    arrives along ``gather_dim`` in rank order (gloo has ``all_to_all`` on host tensors; NCCL/HCCL on device ones)."""
    size = dist.get_world_size(group)
    chunks = [c.contiguous() for c in x.chunk(size, dim=scatter_dim)]
    out = [torch.empty_like(chunks[0]) for _ in range(size)]
    dist.all_to_all(out, chunks, group=group)
    return torch.cat(out, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.group, gather_dim, scatter_dim), None, None, None


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) whose backward all-reduces too: the gradient of the sum of the ranks' losses."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


@dataclass
class _Shard:
    """One rank's slice ``[start, end)`` of a packed row padded to ``full_positions.shape[-1]`` tokens."""

    start: int
    end: int
    full_positions: torch.Tensor
    """``(1, padded_total)`` text positions of the whole row (the attention's sequence boundaries)."""
    group: Any


def _attention(inner: str):
    def attention(module, query, key, value, attention_mask, *args, position_ids=None, **kwargs):
        function = ALL_ATTENTION_FUNCTIONS[inner]
        shard = _ACTIVE
        if (shard is None or attention_mask is not None or not getattr(module, "is_causal", True)
                or query.shape[2] != shard.end - shard.start):
            return function(module, query, key, value, attention_mask, *args, position_ids=position_ids, **kwargs)
        # (1, heads, total / sp, d) -> (1, heads / sp, total, d)
        query, key, value = (_AllToAll.apply(t, shard.group, 1, 2) for t in (query, key, value))
        out, weights = function(module, query, key, value, attention_mask, *args,
                                position_ids=shard.full_positions, **kwargs)
        # (1, total, heads / sp, d) -> (1, total / sp, heads, d)
        return _AllToAll.apply(out, shard.group, 1, 2), weights
    return attention


def attention_name(inner: str) -> str:
    """The ``attn_implementation`` name of ``inner`` (``easyrl_packed_sdpa``, ``flash_attention_2``, ...) wrapped in
    Ulysses' all-to-alls, registered with transformers (attention and mask functions) on first use."""
    name = f"easyrl_ulysses_{inner}"
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, _attention(inner))
        if inner in ALL_MASK_ATTENTION_FUNCTIONS:
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    return name


def check_heads(hf_config: Any, size: int, key: str = "worker.actor.ulysses_size") -> None:
    """ValueError (naming ``key``, the head counts and the sizes that would fit) unless the text model's query and
    key/value heads divide by ``size`` and it has no linear-attention layers (their scan runs along the sequence)."""
    if size <= 1:
        return
    text = text_config(hf_config)
    if "linear_attention" in (getattr(text, "layer_types", None) or []):
        raise ValueError(f"{key}={size}: {text.model_type} has linear-attention layers, which sequence parallelism "
                         "does not split; set it to 1")
    heads, kv = text.num_attention_heads, getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if heads % size or kv % size:
        fits = [d for d in range(1, kv + 1) if heads % d == 0 and kv % d == 0]
        raise ValueError(f"{key}={size} must divide the model's attention heads ({heads}) and key/value heads "
                         f"({kv}): each rank attends with its share of both; choose one of {', '.join(map(str, fits))}")


class SequenceParallel:
    """This rank's sequence-parallel group (``group``: its torch.distributed group), ranks
    ``[g * size, (g + 1) * size)``."""

    def __init__(self, group: Any):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._hooked: set[int] = set()

    def attach(self, model: torch.nn.Module) -> None:
        """Hook ``model``'s text decoder (the module holding the ``layers``) so that, inside :meth:`sharded`, it
        receives this rank's slice of its input ids or embeddings and positions (once per model)."""
        decoder = next(m for m in model.modules() if isinstance(getattr(m, "layers", None), torch.nn.ModuleList)
                       and hasattr(m, "embed_tokens"))
        if id(decoder) not in self._hooked:
            decoder.register_forward_pre_hook(_slice_decoder_inputs, with_kwargs=True)
            self._hooked.add(id(decoder))

    def local_range(self, total: int) -> tuple[int, int]:
        """``[start, end)`` of this rank's slice of a packed row of ``total`` tokens padded to a multiple of the
        group size (what :meth:`sharded` gives the decoder)."""
        local = -(-total // self.size)
        return self.rank * local, (self.rank + 1) * local

    @contextmanager
    def sharded(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor,
                labels: torch.Tensor) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor, "Gather"]]:
        """Yields ``(inputs, labels, gather)`` for one packed row (``input_ids`` ``(1, total)``, ``position_ids``
        ``(1, total)`` or mRoPE's ``(4, 1, total)``, ``keep`` ``(n,)`` the packed positions to score and ``labels``
        their tokens): the model kwargs (the whole row padded to a multiple of the group size, which the decoder
        slices; this rank's local ``logits_to_keep``), this rank's labels, and ``gather`` turning its ``(n_local, c)``
        scores into ``(n, c)``."""
        global _ACTIVE
        total = input_ids.shape[-1]
        start, end = self.local_range(total)
        pad = -total % self.size
        if pad:
            # a dummy sequence (positions 0, 1, ...) at the end: its own attention block, never scored
            input_ids = torch.cat([input_ids, input_ids.new_zeros(1, pad)], dim=-1)
            extra = torch.arange(pad, device=position_ids.device, dtype=position_ids.dtype)
            position_ids = torch.cat([position_ids, extra.expand(*position_ids.shape[:-1], pad)], dim=-1)
        mine = (keep >= start) & (keep < end)
        text_positions = position_ids[0] if position_ids.dim() == 3 else position_ids
        _ACTIVE = _Shard(start, end, text_positions, self.group)
        inputs = dict(input_ids=input_ids, position_ids=position_ids, logits_to_keep=keep[mine] - start)
        # kept after the block: gradient checkpointing recomputes the layers (their attention) during the backward
        yield inputs, labels[mine], Gather(mine, self.group)


class Gather:
    """Scores of this rank's kept positions -> those of all kept positions, summed over the group (differentiable)."""

    def __init__(self, mine: torch.Tensor, group: Any):
        self.mine, self.group = mine, group

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        full = scores.new_zeros((self.mine.shape[0], *scores.shape[1:]))
        full = full.index_put((self.mine.nonzero().flatten(),), scores)
        return _SumOverGroup.apply(full, self.group)


def _slice_decoder_inputs(module, args, kwargs):
    shard = _ACTIVE
    positions = kwargs.get("position_ids")
    if shard is None or positions is None or positions.shape[-1] != shard.full_positions.shape[-1]:
        return None  # not a sharded row (another model's forward after the block)
    for name in ("input_ids", "inputs_embeds"):
        if kwargs.get(name) is not None:
            kwargs[name] = kwargs[name][:, shard.start:shard.end]
    kwargs["position_ids"] = kwargs["position_ids"][..., shard.start:shard.end]
    masks = kwargs.get("visual_pos_masks")
    if masks is not None:  # Qwen3-VL deepstack: this slice's visual positions and their features
        before, inside = int(masks[:, :shard.start].sum()), int(masks[:, shard.start:shard.end].sum())
        kwargs["visual_pos_masks"] = masks[:, shard.start:shard.end]
        kwargs["deepstack_visual_embeds"] = [e[before:before + inside] for e in kwargs["deepstack_visual_embeds"]]
    return args, kwargs


def init_sequence_parallel(size: int) -> Optional[SequenceParallel]:
    """Split the process group into consecutive groups of ``size`` ranks (collective: every rank calls it, once) and
    keep this rank's; None (and no group) for ``size`` 1."""
    global _GROUP
    if size <= 1:
        return None
    world = dist.get_world_size()
    groups = [dist.new_group(list(range(g, g + size))) for g in range(0, world, size)]
    _GROUP = SequenceParallel(groups[dist.get_rank() // size])
    return _GROUP


def sequence_parallel_group() -> Optional[SequenceParallel]:
    """This process's group (:func:`init_sequence_parallel`), None without sequence parallelism."""
    return _GROUP
