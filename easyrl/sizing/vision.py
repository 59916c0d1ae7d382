"""The vision tower's share of the memory (Qwen-VL) for the largest image one prompt holds (docs/simulate.md,
"Images")."""

from __future__ import annotations

import math

from easyrl.config import PPOConfig
from easyrl.sizing.anatomy import DTYPE_BYTES, GIB, VisionShape

TEXT_TOKENS = 64
"""Prompt tokens kept for text beside the image (chat template, vision start/end tokens, the question)."""


def prompt_image_grid(config: PPOConfig, vision: VisionShape) -> "tuple[int, int, int] | None":
    """``image_grid_thw`` ``(1, H / patch, W / patch)`` of the largest image one prompt holds: a square at
    ``data.max_pixels`` resized as the dataset does, shrunk until its tokens fit ``data.max_prompt_length`` beside
    :data:`TEXT_TOKENS`; None without room."""
    from easyrl.data.images import target_size

    data = config.data
    factor = vision.patch_size * vision.merge_size
    room = data.max_prompt_length - TEXT_TOKENS  # image tokens the prompt can hold
    if room < 1:
        return None
    max_pixels = min(data.max_pixels, room * factor * factor)
    side = math.isqrt(data.max_pixels)
    width, height = target_size(side, side, max(min(data.min_pixels, max_pixels), factor * factor), max_pixels,
                                factor)
    return 1, height // vision.patch_size, width // vision.patch_size


def _image_bytes(config: PPOConfig, vision: VisionShape, tokens: int) -> tuple[int, int, int, int]:
    """``(P, compute bytes, pixels, image tokens)`` of a micro-batch of ``tokens``: ``P`` patches, one image of
    :func:`prompt_image_grid` per prompt of ``max_prompt_length + max_response_length`` tokens (at least one prompt;
    0 without room for an image); bytes of the pixels (float32 + compute copy) and of the mergers' image tokens
    (``P / merge^2 x out_hidden_size``, each merger's)."""
    grid = prompt_image_grid(config, vision)
    prompts = max(1, tokens // (config.data.max_prompt_length + config.data.max_response_length))
    patches = prompts * math.prod(grid) if grid is not None else 0
    cb = DTYPE_BYTES[config.worker.actor.fsdp.param_dtype]
    return (patches, cb, patches * vision.patch_dim * (4 + cb),
            patches // vision.merge_size ** 2 * vision.out_hidden_size * cb * vision.mergers)


def vision_activations(config: PPOConfig, vision: VisionShape) -> dict[str, float]:
    """GiB the vision tower holds at the peak of one actor update micro-batch of ``P`` patches: per patch the pixels
    (float32 + compute copy), each block's input (checkpointing) or what it keeps for backward, the mergers' inputs
    and output tokens; a frozen tower only its output (with LoRA as much as a trained one: peft hooks it)."""
    actor = config.worker.actor
    patches, cb, pixels, output = _image_bytes(config, vision, config.token_budget(
        actor.micro_batch_size_per_device_for_update))
    if not patches:
        return {}
    if actor.model.freeze_vision_tower and not config.uses_lora:
        return {"vision tower (update micro-batch)": output / GIB}
    mlp = (4 if vision.gated else 2) * vision.intermediate_size
    if actor.fsdp.enable_gradient_checkpointing:
        blocks = vision.depth * patches * vision.hidden_size * cb
    else:
        blocks = vision.depth * patches * (mlp + 12 * vision.hidden_size) * cb
    mergers = patches * vision.hidden_size * (4 * cb * vision.mergers + 4)
    return {"vision tower (update micro-batch)": (pixels + blocks + mergers + output) / GIB}


def vision_forward(config: PPOConfig, vision: VisionShape, tokens: int, text_hidden: int) -> dict[str, float]:
    """GiB images add to an experience forward of ``tokens`` at its peak: the pixels (float32 + compute copy), the
    mergers' image tokens (``P / merge^2 x out_hidden_size``) and the input embeddings (``tokens x hidden``)."""
    patches, cb, pixels, image_tokens = _image_bytes(config, vision, tokens)
    if not patches:
        return {}
    return {"vision (pixels, image tokens)": (pixels + image_tokens + tokens * text_hidden * cb) / GIB}


def vision_start(config: PPOConfig, vision: VisionShape, tokens: int) -> float:
    """Bytes the vision tower holds before its first block for ``tokens``: the pixels, the patch embedding's output
    (``P x hidden``) and a learned position embedding's interpolation (``P x 4 x hidden``, float32 weights)."""
    patches, cb, pixels, _ = _image_bytes(config, vision, tokens)
    interpolation = patches * 4 * vision.hidden_size * (cb + 4) if vision.position_embedding else 0
    return pixels + patches * vision.hidden_size * cb + interpolation
