"""The vision tower's share of the actor update's memory (Qwen-VL): what it holds at the update's peak for the
largest image one prompt holds (``easyrl simulate`` measured it; docs/simulate.md)."""

from __future__ import annotations

from easyrl.config import PPOConfig
from easyrl.sizing.anatomy import DTYPE_BYTES, GIB, VisionShape

TEXT_TOKENS = 64
"""Prompt tokens kept for text beside the image (chat template, vision start/end tokens, the question)."""


def prompt_image_grid(config: PPOConfig, vision: VisionShape) -> "tuple[int, int, int] | None":
    """``image_grid_thw`` ``(1, H / patch, W / patch)`` of the largest image one prompt holds: a square image at
    ``data.max_pixels``, smart-resized as the dataset and the processor do (``easyrl.data.images.target_size``,
    sides multiples of ``patch x merge``), shrunk to the largest square whose image tokens (``H x W / (patch x
    merge)^2``) fit in ``data.max_prompt_length`` beside :data:`TEXT_TOKENS` (``data.filter_overlong_prompts`` drops
    a longer prompt). None when ``data.max_prompt_length`` leaves no room for an image beside :data:`TEXT_TOKENS`.
    """
    import math

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


def vision_activations(config: PPOConfig, vision: VisionShape) -> dict[str, float]:
    """GiB that the vision tower holds at the peak of one actor update micro-batch (in the middle of the language
    model's backward, before the tower's own): every prompt of the micro-batch (``T / (max_prompt_length +
    max_response_length)`` of them) with the largest image (:func:`prompt_image_grid`), ``P`` patches in all. Per
    patch: ``pixel_values`` on the device (float32) and their compute-dtype copy for the patch embedding's backward;
    with gradient checkpointing (easyrl checkpoints the vision blocks as the decoder layers) each block's input
    (``depth x hidden``); without, what every block keeps for its backward (``(gate, up, activation, product | fc1,
    activation) x intermediate`` and ``~12 x hidden``: norms, qkv, the rotary float32 q/k, attention output,
    projection); then each patch merger's inputs (norm, two linears, activation: ``4 x hidden``) and its output
    tokens (``P / merge^2 x out_hidden_size``), and the final merger's float32 norm. The block recomputed for the
    tower's backward comes after the language model's activations are freed: it is not on top of this peak (easyrl
    simulate: Qwen2.5-VL-7B, 4 x 7744 patches, 2.9 GiB above the text-only update; this counts 3.0). The fused
    attention kernels hold no ``patches x patches`` weights. A tower frozen by ``freeze_vision_tower`` keeps nothing
    for backward: only its output is counted. With LoRA the tower keeps as much even where it has no adapter (the
    default ``exclude_modules`` ``.*visual.*``): peft's ``get_peft_model`` calls transformers'
    ``enable_input_require_grads``, which hooks every sub-model's input embedding, the vision tower's patch embedding
    included, so its blocks build a graph (easyrl simulate: Qwen2.5-VL-7B LoRA recipe, 2.6 GiB).
    """
    actor = config.worker.actor
    cb = DTYPE_BYTES[actor.fsdp.param_dtype]
    tokens = config.token_budget(actor.micro_batch_size_per_device_for_update)
    samples = max(1, tokens // (config.data.max_prompt_length + config.data.max_response_length))
    grid = prompt_image_grid(config, vision)
    if grid is None:
        return {}
    patches = samples * grid[0] * grid[1] * grid[2]
    frozen = actor.model.freeze_vision_tower and not config.uses_lora
    output = patches // vision.merge_size ** 2 * vision.out_hidden_size * cb * vision.mergers
    if frozen:
        return {"vision tower (update micro-batch)": output / GIB}
    pixels = patches * vision.patch_dim * (4 + cb)
    mlp = (4 if vision.gated else 2) * vision.intermediate_size
    if actor.fsdp.enable_gradient_checkpointing:
        blocks = vision.depth * patches * vision.hidden_size * cb
    else:
        blocks = vision.depth * patches * (mlp + 12 * vision.hidden_size) * cb
    mergers = patches * vision.hidden_size * (4 * cb * vision.mergers + 4)
    return {"vision tower (update micro-batch)": (pixels + blocks + mergers + output) / GIB}


def vision_forward(config: PPOConfig, vision: VisionShape, tokens: int, text_hidden: int) -> dict[str, float]:
    """GiB that images add to an experience forward without autograd (old log-probs, reference) of ``tokens``
    (``(max_prompt_length + max_response_length)`` each, with the largest image: :func:`prompt_image_grid`), at its
    peak in a decoder layer's MLP, when the tower is done: ``pixel_values`` on the device (float32) and their
    compute-dtype copy, the image tokens of the final and DeepStack mergers (``P / merge^2 x out_hidden_size``), and
    the input embeddings with the image tokens scattered in (``tokens x hidden``, beside the plain embeddings). easyrl
    simulate, Qwen2.5-VL-7B at 16 x 4096 tokens: 1.5 GiB above the text-only forward; this counts 1.5."""
    length = config.data.max_prompt_length + config.data.max_response_length
    grid = prompt_image_grid(config, vision)
    if grid is None:
        return {}
    cb = DTYPE_BYTES[config.worker.actor.fsdp.param_dtype]
    patches = max(1, tokens // length) * grid[0] * grid[1] * grid[2]
    pixels = patches * vision.patch_dim * (4 + cb)
    image_tokens = patches // vision.merge_size ** 2 * vision.out_hidden_size * cb * vision.mergers
    return {"vision (pixels, image tokens)": (pixels + image_tokens + tokens * text_hidden * cb) / GIB}


def vision_start(config: PPOConfig, vision: VisionShape, tokens: int) -> float:
    """Bytes the vision tower holds before its first block, for an experience forward of ``tokens`` (one image of
    :func:`prompt_image_grid` per prompt, ``P`` patches in all): ``pixel_values`` on the device (float32) and their
    compute-dtype copy, the patch embedding's output (``P x hidden``), and, for a tower with a learned position
    embedding (Qwen3-VL, Qwen3.5), its bilinear interpolation: the four corners' embeddings (``P x 4 x hidden``) and
    their product with the float32 weights (transformers' ``(pos_embed(indices) * weights[:, :, None]).sum(1)``).
    easyrl simulate, Qwen3.5-27B (4 x 7744 patches of 1152 wide): 0.27 pixels + 0.07 patch embedding + 0.27 + 0.53
    interpolation = 1.13 GiB; this counts 1.13. ``experience.forward_start`` adds it at the forward's start, where
    FSDP2 still holds the root group's all-gather output."""
    grid = prompt_image_grid(config, vision)
    if grid is None:
        return 0.0
    cb = DTYPE_BYTES[config.worker.actor.fsdp.param_dtype]
    length = config.data.max_prompt_length + config.data.max_response_length
    patches = max(1, tokens // length) * grid[0] * grid[1] * grid[2]
    interpolation = patches * 4 * vision.hidden_size * (cb + 4) if vision.position_embedding else 0
    return patches * vision.patch_dim * (4 + cb) + patches * vision.hidden_size * cb + interpolation
