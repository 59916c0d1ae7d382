"""Tool images on the engines and in the actor's inputs (docs/agents.md, "Tool images"): each is resized exactly as a
prompt image, and its processor outputs are appended to the prompt's ``multi_modal_inputs`` in the order of the image
pads (the turn-level part: ``easyrl.agents.tool_images``)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from PIL import Image

from easyrl.agents.tool_images import ToolImages
from easyrl.data.images import process_image

__all__ = ["VLToolImages", "tool_images_for"]

IMAGE_KEYS = ("pixel_values", "image_grid_thw")


class VLToolImages(ToolImages):
    """``ToolImages`` of a Qwen-VL ``processor`` within the dataset's pixel bounds and patch ``factor``, at most
    ``limit`` images (``worker.rollout.limit_images``)."""

    def __init__(self, processor: Any, min_pixels: int, max_pixels: int, factor: int, limit: int):
        self.processor = processor
        self.bounds = (min_pixels, max_pixels, factor)
        pad_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
        super().__init__(self._prepare, int(pad_id), limit)

    def _prepare(self, image: Image.Image) -> tuple[Image.Image, int]:
        """The image at its target size and its number of image tokens (both sides are multiples of ``factor``)."""
        image = process_image(image, *self.bounds)
        return image, image.width * image.height // self.bounds[2] ** 2

    def actor_inputs(self, prompt_inputs: dict[str, torch.Tensor], images: list[Image.Image]
                     ) -> dict[str, torch.Tensor]:
        """The prompt's processor outputs with ``images``' appended (``prompt_inputs`` itself when there are none)."""
        if not images:
            return prompt_inputs
        tool = self.processor.image_processor(images=images, return_tensors="pt")
        merged = dict(prompt_inputs)
        for key in IMAGE_KEYS:
            merged[key] = torch.cat([prompt_inputs[key], tool[key]]) if key in prompt_inputs else tool[key]
        return merged


def tool_images_for(dataset: Any, limit: int) -> Optional[VLToolImages]:
    """Tool images for the model of ``dataset`` (an ``RLDataset``); None for a text-only model."""
    processor = getattr(dataset, "processor", None)
    if processor is None or getattr(processor, "image_processor", None) is None:
        return None
    return VLToolImages(processor, dataset.min_pixels, dataset.max_pixels, dataset.factor, limit)
