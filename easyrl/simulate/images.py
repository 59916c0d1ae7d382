"""The images of a vision-language budget micro-batch (docs/simulate.md, "Images"): one per prompt, the largest the
config admits, carried as the trainer sends them, so the simulated phases run the vision tower."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from easyrl.config import PPOConfig
from easyrl.sizing.anatomy import vision_shape
from easyrl.sizing.vision import prompt_image_grid


@dataclass(frozen=True)
class ImageGrid:
    """One image as the Qwen-VL processor cuts it."""

    grid_thw: tuple[int, int, int]
    """``(temporal, height, width)`` in patches (``image_grid_thw``'s row)."""
    patch_dim: int
    """``in_channels x temporal_patch_size x patch_size^2``: ``pixel_values``' width."""
    merge: int
    """``spatial_merge_size``: ``merge x merge`` patches make one image token."""
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int

    @property
    def patches(self) -> int:
        """Rows of ``pixel_values`` for this image."""
        t, h, w = self.grid_thw
        return t * h * w

    @property
    def tokens(self) -> int:
        """Image pad tokens in the prompt for this image."""
        return self.patches // (self.merge * self.merge)


def image_grid(hf_config, config: PPOConfig) -> Optional[ImageGrid]:
    """The largest image one prompt of ``config`` holds (``easyrl.sizing.vision.prompt_image_grid``); None for a
    text model or no room: a text-only batch."""
    vision = vision_shape(hf_config)
    grid = prompt_image_grid(config, vision) if vision is not None else None
    if grid is None:
        return None
    text = getattr(hf_config, "text_config", None) or hf_config

    def token(key: str) -> int:
        value = getattr(hf_config, key, None)
        return int(value if value is not None else getattr(text, key))

    return ImageGrid(grid, vision.patch_dim, vision.merge_size, token("image_token_id"),
                     token("vision_start_token_id"), token("vision_end_token_id"))


def add_images(input_ids: torch.Tensor, prompt_length: int, grid: ImageGrid) -> list[dict[str, torch.Tensor]]:
    """Put one image's tokens (vision start, ``grid.tokens`` pads, vision end) in each prompt of ``input_ids``
    ``(bsz, prompt_length + response)``, in place; returns per sample ``pixel_values`` ``(grid.patches,
    grid.patch_dim)`` float32 and ``image_grid_thw`` ``(1, 3)`` int64, host tensors."""
    start = (prompt_length - grid.tokens - 2) // 2  # text before and after the image
    input_ids[:, start] = grid.vision_start_token_id
    input_ids[:, start + 1:start + 1 + grid.tokens] = grid.image_token_id
    input_ids[:, start + 1 + grid.tokens] = grid.vision_end_token_id
    return [{"pixel_values": torch.zeros(grid.patches, grid.patch_dim),
             "image_grid_thw": torch.tensor([grid.grid_thw])} for _ in range(input_ids.shape[0])]
