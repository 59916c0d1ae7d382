"""Image loading and resizing for vision-language prompts.

An image whose sides are multiples of ``factor = patch * merge`` (28 for Qwen2/2.5-VL, 32 for Qwen3-VL) and whose area
lies inside the processor's bounds is not resized again by the HF processor or vLLM, so both count the same
``height * width / factor**2`` image tokens.
"""

from __future__ import annotations

import io
import math
import os
from typing import Any

from PIL import Image

DEFAULT_FACTOR = 28  # Qwen2/2.5-VL: patch 14 x spatial merge 2
MAX_ASPECT_RATIO = 200  # the Qwen-VL processors refuse more elongated images


def target_size(width: int, height: int, min_pixels: int, max_pixels: int, factor: int = DEFAULT_FACTOR
                ) -> tuple[int, int]:
    """``(width, height)`` in pixels that :func:`process_image` gives a ``width x height`` image: scaled (aspect kept)
    into ``[min_pixels, max_pixels]``, each side rounded to a multiple of ``factor`` (down if that overshoots, up if it
    undershoots). ValueError unless ``factor**2 <= min_pixels <= max_pixels``; for an empty side or an aspect ratio
    above 200."""
    if not factor * factor <= min_pixels <= max_pixels:
        raise ValueError(
            f"need {factor}*{factor} <= min_pixels <= max_pixels, got min_pixels={min_pixels}, max_pixels={max_pixels} "
            "(check data.min_pixels / data.max_pixels)"
        )
    if width <= 0 or height <= 0:
        raise ValueError(f"image has an empty size {width}x{height}")
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise ValueError(f"image {width}x{height} has an aspect ratio above {MAX_ASPECT_RATIO}, which Qwen-VL rejects")

    area = width * height
    scale = 1.0
    if area > max_pixels:
        scale = math.sqrt(max_pixels / area)
    elif area < min_pixels:
        scale = math.sqrt(min_pixels / area)
    w, h = width * scale, height * scale

    new_w = max(factor, round(w / factor) * factor)
    new_h = max(factor, round(h / factor) * factor)
    if new_w * new_h > max_pixels:
        new_w = max(factor, math.floor(w / factor) * factor)
        new_h = max(factor, math.floor(h / factor) * factor)
    elif new_w * new_h < min_pixels:
        new_w = math.ceil(w / factor) * factor
        new_h = math.ceil(h / factor) * factor
    return new_w, new_h


def load_image(image: Any) -> Image.Image:
    """Open a ``PIL.Image``, ``{"bytes", "path"}`` dict or file path, unresized; ValueError naming the source if it
    cannot be read, TypeError for another kind of value."""
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, dict):
        data, path = image.get("bytes"), image.get("path")
        if data is not None:
            source = f"image bytes (path={path!r})"
            opener = lambda: Image.open(io.BytesIO(data))  # noqa: E731
        elif path:
            source, opener = f"image file {path!r}", lambda: Image.open(path)
        else:
            raise ValueError(f"image dict has neither 'bytes' nor 'path': keys {sorted(image)}")
    elif isinstance(image, (str, os.PathLike)):
        source, opener = f"image file {os.fspath(image)!r}", lambda: Image.open(image)
    else:
        raise TypeError(f"expected a PIL image, a {{'bytes', 'path'}} dict or a path, got {type(image).__name__}")
    try:
        img = opener()
        img.load()
    except (OSError, ValueError, SyntaxError) as err:  # PIL raises these for missing / corrupt files
        raise ValueError(f"cannot read {source}: {err}") from err
    return img


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` in RGB; transparent parts (RGBA, LA, palette with transparency) are laid over white, not black."""
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def process_image(image: Any, min_pixels: int, max_pixels: int, factor: int = DEFAULT_FACTOR) -> Image.Image:
    """``image`` loaded, in RGB, bicubic-resized to :func:`target_size`. Raises as :func:`load_image` and
    :func:`target_size`."""
    img = to_rgb(load_image(image))
    size = target_size(img.width, img.height, min_pixels, max_pixels, factor)
    if size != img.size:
        img = img.resize(size, Image.Resampling.BICUBIC)
    return img
