"""Images returned by tools, for Qwen-VL models (docs/agents.md, "Tool images").

A tool returns ``{"text": str, "image": image or [images]}`` or a bare ``PIL.Image`` (loaded in the tool's process). The
tool message holds content items, images first, rendered as one ``<|image_pad|>`` per image. The trajectory keeps the
pads expanded (``n`` per image, as the processor gives them), so its tokens, mask and log-probs line up with the
actor's; each generate call collapses every run back to one pad (a sampled pad never appears: vLLM's ``bad_words``).
"""

from __future__ import annotations

from typing import Any, Callable

from PIL import Image

__all__ = ["split_images", "ToolImages", "collapse_pads", "expand_pads"]


def split_images(value: Any) -> tuple[Any, list[Image.Image]]:
    """``(text part, images)`` of a tool's return value (``(value, [])`` without images), pixels loaded. TypeError
    for a non-``PIL.Image``, OSError for unreadable pixels: the executor returns either as the tool's error."""
    if not (isinstance(value, Image.Image) or (isinstance(value, dict) and "image" in value
                                                and set(value) <= {"text", "image"})):
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
        """The tool message of ``text`` and ``images`` (plain text, or image items then the text as content items);
        those under the limit are prepared and added to ``traj``."""
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
        content = [{"type": "image"} for _ in kept] + ([{"type": "text", "text": text}] if text else [])
        return {"role": "tool", "content": content if kept else text}

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
