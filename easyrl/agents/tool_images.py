"""Images returned by tools, for Qwen-VL models (docs/agents.md, "Tool images").

A tool returns ``{"text": str, "image": image or [images]}`` or a bare ``PIL.Image`` (loaded in the tool's process).
The tool message holds content items, images first, rendered as one ``<|image_pad|>`` per image. The trajectory
keeps the pads expanded (``n`` per image, as the processor gives them), so its tokens, mask and log-probs line up
with the actor's; each generate call collapses every run back to one pad (a sampled pad never appears: vLLM's
``bad_words``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from PIL import Image

from easyrl.errors import ConfigError

__all__ = ["split_images", "has_images", "tool_message", "ToolImages", "collapse_pads", "expand_pads",
           "check_images_allowed", "TEXT_ONLY_ERROR"]

TEXT_ONLY_ERROR = ("the tool {name!r} returned {count} image(s), but the model is text-only (it has no image "
                   "processor): tools may return images only for Qwen-VL models (Qwen2.5-VL, Qwen3-VL); return text "
                   "from the tool (a path or a caption) or train a VL model.")
"""docs/errors.md A09."""


def has_images(value: Any) -> bool:
    """Whether a tool's return value carries images (see the module docstring)."""
    return isinstance(value, Image.Image) or (
        isinstance(value, dict) and "image" in value and set(value) <= {"text", "image"})


def split_images(value: Any) -> tuple[Any, list[Image.Image]]:
    """``(text part, images)`` of a tool's return value (``(value, [])`` without images), pixels loaded. TypeError
    for a non-``PIL.Image``, OSError for unreadable pixels: the executor returns either as the tool's error."""
    if not has_images(value):
        return value, []
    images = [value] if isinstance(value, Image.Image) else value["image"]
    images = list(images) if isinstance(images, (list, tuple)) else [images]
    for image in images:
        if not isinstance(image, Image.Image):
            raise TypeError(f"a tool image must be a PIL.Image (open files or bytes with PIL.Image.open), got "
                            f"{type(image).__name__}")
        image.load()
    text = "" if isinstance(value, Image.Image) else value.get("text") or ""
    return text, images


def tool_message(text: str, n_images: int) -> dict[str, Any]:
    """The tool message: plain text, or ``n_images`` image items then the text (if any) as content items."""
    if not n_images:
        return {"role": "tool", "content": text}
    content: list[dict[str, Any]] = [{"type": "image"} for _ in range(n_images)]
    if text:
        content.append({"type": "text", "text": text})
    return {"role": "tool", "content": content}


def collapse_pads(ids: list[int], pad_id: int) -> list[int]:
    """``ids`` with every run of ``pad_id`` replaced by one pad (vLLM's prompt form)."""
    return [token for i, token in enumerate(ids) if not (token == pad_id and i and ids[i - 1] == pad_id)]


def expand_pads(ids: list[int], pad_id: int, counts: list[int]) -> list[int]:
    """``ids`` with the ``i``-th ``pad_id`` repeated ``counts[i]`` times; ValueError for another pad count."""
    found = ids.count(pad_id)
    if found != len(counts):
        raise ValueError(f"the chat template rendered {found} image pad(s) for {len(counts)} tool image(s)")
    out: list[int] = []
    left = iter(counts)
    for token in ids:
        out += [pad_id] * next(left) if token == pad_id else [token]
    return out


class ToolImages:
    """Tool images of a VL model: ``prepare(image) -> (resized image, its image tokens)``, ``pad_id`` the
    ``<|image_pad|>`` id, ``limit`` images per trajectory with the prompt's (``worker.rollout.limit_images``); an image
    beyond it is dropped, the tool message says so and ``multi_turn/tool_images_dropped`` counts it."""

    def __init__(self, prepare: Callable[[Image.Image], tuple[Image.Image, int]], pad_id: int, limit: int):
        self.prepare = prepare
        self.pad_id = pad_id
        self.limit = limit

    def attach(self, traj: Any, text: str, images: list[Image.Image]) -> dict[str, Any]:
        """The tool message of ``text`` and ``images``; those under the limit are prepared and added to ``traj``."""
        room = max(0, self.limit - traj.prompt_images - len(traj.images))
        kept, dropped = images[:room], len(images) - room
        for image in kept:
            image, tokens = self.prepare(image)
            traj.images.append(image)
            traj.image_tokens.append(tokens)
        traj.tool_images += len(kept)
        if dropped > 0:
            traj.tool_images_dropped += dropped
            text = (f"{text}\n" if text else "") + (f"[{dropped} image(s) not shown: at most {self.limit} images per "
                                                    "conversation (worker.rollout.limit_images)]")
        return tool_message(text, len(kept))

    def expand(self, traj: Any, ids: list[int], new_images: int) -> list[int]:
        """The tool turn ``ids`` with the last ``new_images`` pads expanded; a turn over the budget is cut before the
        first image that does not fit whole (dropped from ``traj`` with the later ones) and ends the trajectory."""
        counts = traj.image_tokens[len(traj.image_tokens) - new_images:] if new_images else []
        ids = expand_pads(ids, self.pad_id, counts)
        if len(ids) <= traj.remaining:
            return ids
        cut, seen = traj.remaining, 0
        for start in _run_starts(ids, self.pad_id):
            if start + counts[seen] > traj.remaining:
                cut = start
                break
            seen += 1
        lost = new_images - seen
        if lost:
            del traj.images[len(traj.images) - lost:], traj.image_tokens[len(traj.image_tokens) - lost:]
            traj.tool_images -= lost
        traj.done = True
        return ids[:cut]


def _run_starts(ids: list[int], pad_id: int) -> list[int]:
    return [i for i, token in enumerate(ids) if token == pad_id and (i == 0 or ids[i - 1] != pad_id)]


def check_images_allowed(images: Optional["ToolImages"], name: str, count: int) -> None:
    """Raise A09 when a tool returned ``count`` images for a text-only model (``images`` is None)."""
    if count and images is None:
        raise ConfigError(TEXT_ONLY_ERROR.format(name=name, count=count))
