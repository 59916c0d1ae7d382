"""Workarounds of vLLM's CPU backend bugs (API differences: ``easyrl.workers.vllm_compat``), each a no-op off the
CPU; why each exists: docs/vllm-versions.md, "CPU backend fixes". ``repack_cpu_moe_experts`` and
``repack_cpu_embedding_heads`` run inside vLLM's worker after a reload (``weight_sync.reload_and_report``);
``remove_stale_tp_shm`` before the engine starts and on close.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

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
