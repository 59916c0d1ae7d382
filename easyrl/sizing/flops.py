"""Model FLOPs utilization (MFU): the FLOPs a step needs by PaLM's formula (Chowdhery et al. 2022, "PaLM: Scaling
Language Modeling with Pathways", Appendix B), extended to the vision tower, over the devices' dense peak; the weight
counts come from the model itself (``easyrl.sizing.anatomy.model_anatomy``). docs/metrics.md, "The FLOPs formula".
"""

from __future__ import annotations

from typing import Optional

import torch

from easyrl.sizing.anatomy import ModelShape


def forward_flops(shape: ModelShape, seq_lens: list[int], image_patches: list[int]) -> float:
    """Forward FLOPs of a batch: ``2 N s + 4 L H Q s^2`` summed over sequences, plus the vision tower over every image
    (``2 N_patch p + 2 N_merge p / m + 4 L_v H_v Q_v p^2``). ``seq_lens``: tokens of each sequence (prompt + response,
    image tokens included); ``image_patches``: patches of each image (``t * h * w`` of its ``image_grid_thw``)."""
    flops = sum(2.0 * shape.text_weights * s + 4.0 * shape.num_layers * shape.attn_width * s * s for s in seq_lens)
    vision = shape.vision
    for p in image_patches:
        flops += 2.0 * vision.patch_weights * p + 2.0 * vision.merge_weights * p / vision.merge_size ** 2
        flops += 4.0 * vision.depth * vision.hidden_size * p * p
    return flops


def compute_mfu_metrics(shape: ModelShape, attention_mask: torch.Tensor, multi_modal_inputs: list[dict],
                        timing: dict[str, float], world_size: int, peak: Optional[float],
                        ppo_epochs: int) -> dict[str, float]:
    """``perf/mfu/actor`` (``ppo_epochs`` x 3 x forward FLOPs over ``timing["update_actor"]``) and
    ``perf/mfu/rollout`` (forward FLOPs over ``timing["gen"]``) on ``world_size`` devices of ``peak`` FLOP/s; empty
    without a peak. ``attention_mask``: ``(bsz, seq_len)``; ``multi_modal_inputs``: per sample its ``*_grid_thw``."""
    if peak is None:
        return {}
    patches = [int(row.prod()) for inputs in multi_modal_inputs for key in ("image_grid_thw", "video_grid_thw")
               if key in (inputs or {}) for row in inputs[key]]  # t * h * w of every image
    forward = forward_flops(shape, attention_mask.sum(-1).tolist(), patches)
    phases = (("actor", 3.0 * ppo_epochs * forward, "update_actor"), ("rollout", forward, "gen"))
    # the fraction of the devices' peak used: flops / (seconds x world_size x peak)
    return {f"perf/mfu/{name}": flops / (timing[phase] * world_size * peak) for name, flops, phase in phases
            if timing.get(phase, 0.0) > 0}
