"""Model FLOPs utilization (MFU): the FLOPs a step needs by formula over the device's dense peak.

The formula is PaLM's (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", Appendix B), extended
to the vision tower. For a forward pass over a sequence of ``s`` tokens through ``L`` layers of ``H`` heads of size
``Q``, with ``N`` matmul weights applied to every token::

    forward FLOPs = 2 * N * s  +  4 * L * H * Q * s**2        (training: 3x, i.e. 6 * N * s + 12 * L * H * Q * s**2)

``2 * N``: one multiply-add per weight per token; ``4 * L * H * Q * s**2``: ``Q K^T`` and ``softmax(.) V``, counted
without the causal half (PaLM's convention). A Qwen-VL step adds the vision tower the same way, with
``N_patch`` weights per image patch (patch embedding and transformer blocks), ``N_merge`` weights per merged token
(the patch merger(s): one per ``spatial_merge_size**2`` patches) and attention over each image's patches (counted
as full attention also in Qwen2.5-VL's windowed layers: an upper bound).

``N`` is counted from the model itself, not from a per-architecture formula: every ``nn.Linear`` and patch-embedding
convolution weight of a meta-device copy (no memory), sorted into text (language model + LM head), per-patch and
per-merged-token weights (``easyrl.sizing.anatomy.model_anatomy``). The input embedding is a lookup, not a matmul:
not counted. ``perf/mfu/rollout`` counts the forward FLOPs of every prompt + response token, as if vLLM's prefix cache
saved nothing (docs/metrics.md).
"""

from __future__ import annotations

from typing import Optional

import torch

from easyrl.sizing.anatomy import ModelShape


def forward_flops(shape: ModelShape, seq_lens: list[int], image_patches: list[int]) -> float:
    """Forward FLOPs of a batch: ``2 N s + 4 L H Q s^2`` summed over sequences, plus the vision tower over every image
    (``2 N_patch p + 2 N_merge p / m + 4 L_v H_v Q_v p^2``).

    Args:
        shape: the model's ``ModelShape`` with its weight counts (``easyrl.sizing.anatomy.model_anatomy``).
        seq_lens: tokens of each sequence (prompt + response, image placeholder tokens included).
        image_patches: patches of each image (``t * h * w`` of its ``image_grid_thw``), over the whole batch.
    """
    flops = sum(2.0 * shape.text_weights * s + 4.0 * shape.num_layers * shape.attn_width * s * s for s in seq_lens)
    vision = shape.vision
    for p in image_patches:
        flops += 2.0 * vision.patch_weights * p + 2.0 * vision.merge_weights * p / vision.merge_size ** 2
        flops += 4.0 * vision.depth * vision.hidden_size * p * p
    return flops


def mfu(flops: float, seconds: float, world_size: int, peak: Optional[float]) -> Optional[float]:
    """``flops / (seconds * world_size * peak)``, the fraction of the devices' peak used; None without a peak."""
    if peak is None or seconds <= 0:
        return None
    return flops / (seconds * world_size * peak)


def compute_mfu_metrics(shape: ModelShape, attention_mask: torch.Tensor, multi_modal_inputs: list[dict],
                        timing: dict[str, float], world_size: int, peak: Optional[float],
                        ppo_epochs: int) -> dict[str, float]:
    """``perf/mfu/actor``: ``ppo_epochs`` x 3 x forward FLOPs over ``timing["update_actor"]`` seconds;
    ``perf/mfu/rollout``: forward FLOPs over ``timing["gen"]`` seconds; each over ``world_size`` devices of ``peak``
    FLOP/s. Empty without a peak (CPU). ``attention_mask``: ``(bsz, seq_len)``; ``multi_modal_inputs``: per sample,
    its ``image_grid_thw`` / ``video_grid_thw`` ``(n_images, 3)``."""
    if peak is None:
        return {}
    patches = [int(row.prod()) for inputs in multi_modal_inputs for key in ("image_grid_thw", "video_grid_thw")
               if key in (inputs or {}) for row in inputs[key]]  # t * h * w of every image
    forward = forward_flops(shape, attention_mask.sum(-1).tolist(), patches)
    metrics = {}
    for name, flops, phase in (("actor", 3.0 * ppo_epochs * forward, "update_actor"), ("rollout", forward, "gen")):
        value = mfu(flops, timing.get(phase, 0.0), world_size, peak)
        if value is not None:
            metrics[f"perf/mfu/{name}"] = value
    return metrics
