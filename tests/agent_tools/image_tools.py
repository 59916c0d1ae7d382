"""Tools that return images, for the tool-image tests (tests/test_agents_tool_images.py,
tests/test_e2e_multi_turn_vl.py)."""

import zlib

import numpy as np
from PIL import Image


def paint(text: str) -> dict:
    """Paint a picture of a text: random pixels seeded by the text, 56 x 84 (6 image tokens for Qwen2.5-VL).

    Args:
        text: what to paint.
    """
    rng = np.random.default_rng(zlib.crc32(text.encode()))
    image = Image.fromarray(rng.integers(0, 256, (84, 56, 3), dtype=np.uint8))
    return {"text": f"painted {len(text)} chars", "image": [image]}


def snapshot() -> Image.Image:
    """A bare image (no text): a 30 x 30 grey square, resized to the pixel bounds by easyrl."""
    return Image.new("RGB", (30, 30), (128, 128, 128))


def not_an_image() -> dict:
    """Returns a path where an image should be (a tool error)."""
    return {"text": "see the file", "image": ["/no/such/file.png"]}
