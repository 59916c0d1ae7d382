"""``easyrl simulate`` on a vision-language model: the budget micro-batch carries one image per prompt as the trainer
sends it (``easyrl.simulate.phases.vision_grid``), cut as the Qwen-VL processor cuts it, and the estimate counts the
vision tower (``easyrl.sizing.vision.vision_activations``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
VL_7B = ROOT / "easyrl" / "model_configs" / "Qwen2.5-VL-7B-Instruct"
VL_8B = ROOT / "easyrl" / "model_configs" / "Qwen3-VL-8B-Instruct"


def _config(*overrides: str):
    from easyrl.config import load_config

    return load_config(["config=" + str(ROOT / "config.yaml"), *overrides])


@pytest.mark.parametrize("model, max_pixels", [(VL_7B, 262144), (VL_7B, 4194304), (VL_8B, 1048576)])
def test_budget_batch_images_match_the_processor(model, max_pixels):
    """pixel_values, image_grid_thw and the pad tokens of the simulated batch are what transformers' Qwen2-VL image
    processor (the Qwen-VL processors' patch cutting) makes of the dataset's resized image."""
    from PIL import Image
    from transformers import AutoConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from easyrl.data.images import process_image
    from easyrl.simulate.phases import budget_batch, vision_grid

    config = _config(f"worker.actor.model.model_path={model}", f"data.max_pixels={max_pixels}")
    hf = AutoConfig.from_pretrained(model)
    vision = hf.vision_config
    grid = vision_grid(config, str(model))
    batch = budget_batch(config, 2 * (config.data.max_prompt_length + config.data.max_response_length), grid)
    # the dataset's resize of a square image at max_pixels, then the processor (its widths from the vision config)
    factor = vision.patch_size * vision.spatial_merge_size
    room = config.data.max_prompt_length - 64  # the prompt's tokens beside the text
    side = int(np.sqrt(max_pixels))
    image = process_image(Image.new("RGB", (side, side)), config.data.min_pixels,
                          min(max_pixels, room * factor * factor), factor)
    processor = Qwen2VLImageProcessorPil(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                                         temporal_patch_size=vision.temporal_patch_size,
                                         min_pixels=factor * factor, max_pixels=16777216)
    expected = processor(images=[image], return_tensors="pt")
    assert len(batch) == 2 and len(batch["multi_modal_inputs"]) == 2
    for row, inputs in enumerate(batch["multi_modal_inputs"]):
        assert inputs["pixel_values"].shape == expected["pixel_values"].shape
        assert inputs["pixel_values"].dtype == torch.float32 and inputs["pixel_values"].device.type == "cpu"
        assert inputs["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
        prompt = batch["input_ids"][row, :config.data.max_prompt_length]
        pads = int((batch["input_ids"][row] == hf.image_token_id).sum())
        assert pads == int((prompt == hf.image_token_id).sum()) == expected["image_grid_thw"].prod() // (
            vision.spatial_merge_size ** 2) <= config.data.max_prompt_length
        assert int((prompt == hf.vision_start_token_id).sum()) == int((prompt == hf.vision_end_token_id).sum()) == 1


def test_text_models_get_no_images(tmp_path):
    from transformers import Qwen2Config

    from easyrl.simulate.phases import budget_batch, vision_grid

    Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=256).save_pretrained(tmp_path)
    config = _config(f"worker.actor.model.model_path={tmp_path}")
    assert vision_grid(config, str(tmp_path)) is None
    assert "multi_modal_inputs" not in budget_batch(config, 4096).extras


def _vision_term(*overrides: str) -> float:
    from transformers import AutoConfig

    from easyrl.sizing.anatomy import model_shape
    from easyrl.sizing.estimate import estimate_memory

    config = _config(f"worker.actor.model.model_path={VL_7B}", *overrides)
    estimate = estimate_memory(8_000_000_000, 152064, config, 79.2, model_shape(AutoConfig.from_pretrained(VL_7B)))
    return estimate.training.get("vision tower (update micro-batch)", 0.0)


def test_the_estimates_vision_term_grows_with_max_pixels():
    small, large = _vision_term("data.max_pixels=262144"), _vision_term("data.max_pixels=1048576")
    assert 0 < small < large
    # 4 prompts x (1008 / 14)^2 patches, the tower's 32 checkpointed block inputs of 1280 bf16 alone
    assert large > 4 * 72 * 72 * 32 * 1280 * 2 / 2**30
    # a prompt holds at most max_prompt_length image tokens: max_pixels beyond that changes nothing
    assert _vision_term("data.max_pixels=4194304") == _vision_term("data.max_pixels=8388608")
    # a frozen tower keeps no activations for backward
    assert _vision_term("worker.actor.model.freeze_vision_tower=true") < large / 4


def test_the_experience_forwards_count_the_images():
    """config.yaml (Qwen2.5-VL-7B, 16 x 4096 tokens of old log-probs per device): ``easyrl simulate`` holds 17.1 GiB
    with one image per prompt, 15.6 text only; the estimate's image item brings it from 15.5 to within 3%."""
    from transformers import AutoConfig

    from easyrl.sizing.anatomy import model_shape
    from easyrl.sizing.estimate import estimate_memory
    from easyrl.sizing.experience import RoleModel, estimate_experience

    config = _config(f"worker.actor.model.model_path={VL_7B}")
    shape = model_shape(AutoConfig.from_pretrained(VL_7B))
    estimate = estimate_memory(8_292_166_656, 152064, config, 79.2, shape)
    phases = estimate_experience(estimate, config, RoleModel(8_292_166_656, 152064, shape))
    items = phases["old log-probs (forward)"]
    assert items["old log-probs (forward): vision (pixels, image tokens)"] == pytest.approx(1.5, abs=0.1)
    without_adam = sum(items.values()) - estimate.rollout["actor Adam states"]
    assert without_adam == pytest.approx(17.1, rel=0.03)


def _tiny_qwen3_vl(folder: Path) -> str:
    """Qwen3-VL-8B's config at toy widths: 2 decoder layers, a 3-block vision tower with two DeepStack mergers."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(VL_8B)
    text, vision = config.text_config, config.vision_config
    text.hidden_size, text.intermediate_size, text.num_hidden_layers = 128, 256, 2
    text.num_attention_heads, text.num_key_value_heads, text.head_dim = 4, 2, 32
    text.rope_parameters["mrope_section"] = [4, 6, 6]
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:2]
    vision.hidden_size, vision.intermediate_size, vision.depth, vision.num_heads = 64, 128, 3, 2
    vision.out_hidden_size, vision.deepstack_visual_indexes = 128, [0, 1]
    config.save_pretrained(folder)
    return str(folder)


@pytest.mark.slow  # ~20 s alone on 2 cores, ~45 s beside other simulations
def test_a_qwen3_vl_model_simulates_with_images(tmp_path):
    """Every phase runs with the images (the Qwen3-VL DeepStack path runs only with them: its index of the image
    tokens failed on fake tensors), the update's backward through the vision tower included."""
    from easyrl.simulate.phases import simulate
    from easyrl.sizing.devices import DEVICES

    config = _config(f"worker.actor.model.model_path={_tiny_qwen3_vl(tmp_path / 'vl')}", "data.max_prompt_length=320",
                     "data.max_response_length=64", "worker.actor.micro_batch_size_per_device_for_experience=4")
    phases = {p.name: p.peak_gib for p in simulate(config, DEVICES["h100"], log=lambda _: None).phases}
    assert phases["old log-probs (forward)"] > 0 and phases["actor update (fwd+bwd+AdamW)"] > 0
