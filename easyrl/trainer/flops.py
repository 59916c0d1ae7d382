"""Model FLOPs utilization (MFU): the FLOPs a step needs by formula over the device's dense peak.

The formula is PaLM's (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", Appendix B), extended
to the vision tower. For a forward pass over a sequence of ``s`` tokens through ``L`` layers of ``H`` heads of size
``Q``, with ``N`` matmul weights applied to every token::

    forward FLOPs = 2 * N * s  +  4 * L * H * Q * s**2        (training: 3x, i.e. 6 * N * s + 12 * L * H * Q * s**2)

``2 * N``: one multiply-add per weight per token; ``4 * L * H * Q * s**2``: ``Q K^T`` and ``softmax(.) V``, counted
without the causal half (PaLM's convention, also verl's). A Qwen-VL step adds the vision tower the same way, with
``N_patch`` weights per image patch (patch embedding and transformer blocks), ``N_merge`` weights per merged token
(the patch merger(s): one per ``spatial_merge_size**2`` patches) and attention over each image's patches (counted
as full attention also in Qwen2.5-VL's windowed layers: an upper bound).

``N`` is counted from the model itself, not from a per-architecture formula: every ``nn.Linear`` and patch-embedding
convolution weight of a meta-device copy (no memory), sorted into text (language model + LM head), per-patch and
per-merged-token weights. The input embedding is a lookup, not a matmul: not counted.

How the others differ: verl (``verl/utils/flops_counter.py``) uses the same ``6N + 12 L H Q s^2`` but computes ``N``
from config fields per architecture, counts the embedding as a matmul (``2 * vocab * hidden``) and leaves the vision
tower out; EasyR1 uses verl's counter. Both report ``perf/mfu/actor`` from the update phase; easyrl also reports
``perf/mfu/rollout`` (forward FLOPs of every prompt + response token, as if vLLM's prefix cache saved nothing).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

# Dense (no sparsity) BF16 tensor-core peak per device, in TFLOP/s, from the vendors' data sheets; matched as a
# substring of the device name, longest key first. The CPU has no entry: no MFU is reported there unless
# EASYRL_PEAK_TFLOPS gives a nominal peak.
PEAK_TFLOPS: dict[str, float] = {
    "H100": 989.0,   # SXM, which torch names "NVIDIA H100 80GB HBM3"; the PCIe and NVL cards are named below
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H800": 989.0,   # SXM
    "H800 PCIe": 756.0,
    "H200": 989.0,
    "H20": 148.0,
    "A100": 312.0,
    "A800": 312.0,
    "L20": 119.5,
    "L40S": 362.0,
    "B200": 2250.0,
    "910B": 354.0,   # Ascend 910B (FP16 cube peak, as verl lists it)
}
PEAK_ENV = "EASYRL_PEAK_TFLOPS"


def peak_flops(device_name: str) -> Optional[float]:
    """Peak FLOP/s of one device named ``device_name`` (``torch.cuda.get_device_name()``); ``EASYRL_PEAK_TFLOPS``
    overrides; None when unknown (the CPU, unlisted accelerators): no MFU then."""
    if os.environ.get(PEAK_ENV):
        return float(os.environ[PEAK_ENV]) * 1e12
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_TFLOPS[key] * 1e12
    return None


@dataclass(frozen=True)
class ModelShape:
    """What the FLOPs formula needs of a model.

    ``text_weights``: matmul weights applied per text token (``N``); ``patch_weights`` / ``merge_weights``: per image
    patch / per merged visual token; ``attn_width``, ``layers``: ``H * Q`` and ``L`` of the language model;
    ``vision_attn_width``, ``vision_layers``, ``merge``: the vision tower's, and ``spatial_merge_size**2``.
    """

    text_weights: int
    layers: int
    attn_width: int
    patch_weights: int = 0
    merge_weights: int = 0
    vision_layers: int = 0
    vision_attn_width: int = 0
    merge: int = 1

    @classmethod
    def from_hf_config(cls, hf_config) -> "ModelShape":
        """Count the weights of a meta-device model built from ``hf_config`` (see the module docstring)."""
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        vision = getattr(hf_config, "vision_config", None)
        model_class = AutoModelForImageTextToText if vision is not None else AutoModelForCausalLM
        with torch.device("meta"):
            model = model_class.from_config(hf_config)
        text = patch = merge = 0
        for name, module in model.named_modules():
            if not isinstance(module, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv3d)):
                continue
            count = module.weight.numel()
            if ".visual." in f".{name}.":
                if "merger" in name:
                    merge += count
                else:
                    patch += count
            else:
                text += count
        text_config = getattr(hf_config, "text_config", None) or hf_config
        heads = text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
        shape = dict(text_weights=text, layers=text_config.num_hidden_layers, attn_width=heads * head_dim)
        if vision is not None:
            width = getattr(vision, "hidden_size", None) if hasattr(vision, "depth") else None
            width = getattr(vision, "embed_dim", None) or width  # Qwen2-VL names the tower's width embed_dim
            shape.update(patch_weights=patch, merge_weights=merge, vision_layers=vision.depth,
                         vision_attn_width=width, merge=vision.spatial_merge_size ** 2)
        return cls(**shape)


def forward_flops(shape: ModelShape, seq_lens: list[int], image_patches: list[int]) -> float:
    """Forward FLOPs of a batch: ``2 N s + 4 L H Q s^2`` summed over sequences, plus the vision tower over every image
    (``2 N_patch p + 2 N_merge p / m + 4 L_v H_v Q_v p^2``).

    Args:
        shape: the model's ``ModelShape``.
        seq_lens: tokens of each sequence (prompt + response, image placeholder tokens included).
        image_patches: patches of each image (``t * h * w`` of its ``image_grid_thw``), over the whole batch.
    """
    flops = sum(2.0 * shape.text_weights * s + 4.0 * shape.layers * shape.attn_width * s * s for s in seq_lens)
    for p in image_patches:
        flops += 2.0 * shape.patch_weights * p + 2.0 * shape.merge_weights * p / shape.merge
        flops += 4.0 * shape.vision_layers * shape.vision_attn_width * p * p
    return flops


def mfu(flops: float, seconds: float, world_size: int, peak: Optional[float]) -> Optional[float]:
    """``flops / (seconds * world_size * peak)``, the fraction of the devices' peak used; None without a peak."""
    if peak is None or seconds <= 0:
        return None
    return flops / (seconds * world_size * peak)


def batch_shapes(attention_mask: torch.Tensor, multi_modal_inputs: list[dict]) -> tuple[list[int], list[int]]:
    """``(seq_lens, image_patches)`` of a batch for ``forward_flops``: valid tokens per row of ``attention_mask``
    ``(bsz, seq_len)`` and ``t * h * w`` of every image in each sample's ``image_grid_thw`` ``(n_images, 3)``."""
    seq_lens = attention_mask.sum(-1).tolist()
    patches = [int(row.prod()) for inputs in multi_modal_inputs for key in ("image_grid_thw", "video_grid_thw")
               if key in (inputs or {}) for row in inputs[key]]
    return seq_lens, patches


def compute_mfu_metrics(shape: ModelShape, attention_mask: torch.Tensor, multi_modal_inputs: list[dict],
                        timing: dict[str, float], world_size: int, peak: Optional[float],
                        ppo_epochs: int) -> dict[str, float]:
    """``perf/mfu/actor``: ``ppo_epochs`` x 3 x forward FLOPs over ``timing["update_actor"]`` seconds;
    ``perf/mfu/rollout``: forward FLOPs over ``timing["gen"]`` seconds; each over ``world_size`` devices of ``peak``
    FLOP/s. Empty without a peak (CPU)."""
    if peak is None:
        return {}
    forward = forward_flops(shape, *batch_shapes(attention_mask, multi_modal_inputs))
    metrics = {}
    for name, flops, phase in (("actor", 3.0 * ppo_epochs * forward, "update_actor"), ("rollout", forward, "gen")):
        value = mfu(flops, timing.get(phase, 0.0), world_size, peak)
        if value is not None:
            metrics[f"perf/mfu/{name}"] = value
    return metrics
