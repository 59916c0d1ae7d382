"""Images returned by tools, for Qwen-VL models (docs/agents.md, "Tool images").

A tool returns images as a ``{"text": str, "image": [images]}`` dict
(``image`` may also be a single image; ``text`` may be left out), or a bare image. An image is a ``PIL.Image``
(open a file or bytes with ``PIL.Image.open``); its pixels are loaded in the tool's process and cross the process-pool
boundary pickled. Anything else in ``image`` is the tool's error (returned to the model, counted).

The tool message then holds Qwen-VL content items, images first::

    {"role": "tool", "content": [{"type": "image"}, ..., {"type": "text", "text": "..."}]}

which the chat template renders as ``<|vision_start|><|image_pad|><|vision_end|>...``: ONE pad per image, the form
vLLM takes with the image in ``multi_modal_data``. The trajectory keeps the pads EXPANDED (the ``n`` pads vLLM and the
Hugging Face processor turn the image into), so its response tokens, mask and log-probs line up with the actor's
sequence; each generate call collapses every run of pads back to one (:func:`collapse_pads`). A sampled pad never
appears in a response (vLLM's ``bad_words``, ``easyrl.workers.vl_tokens``), so every run of pads in a response is a
tool image.
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
    """``(text part, images)`` of a tool's return value: ``(value, [])`` for a value without images, else the
    ``text`` (``""`` if none) and the images, their pixels loaded (a lazily opened file is read here, in the tool's
    process).

    Raises:
        TypeError: an image that is not a ``PIL.Image``; OSError: one whose pixels cannot be read. The executor
            returns either to the model as the tool's error, and counts it.
    """
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
    """``ids`` with every run of ``pad_id`` replaced by one pad (vLLM's prompt form: it expands each pad again
    from its image)."""
    return [token for i, token in enumerate(ids) if not (token == pad_id and i and ids[i - 1] == pad_id)]


def expand_pads(ids: list[int], pad_id: int, counts: list[int]) -> list[int]:
    """``ids`` (one ``pad_id`` per image) with the ``i``-th pad repeated ``counts[i]`` times.

    Raises:
        ValueError: the number of pads is not ``len(counts)`` (the chat template did not render one pad per image).
    """
    found = ids.count(pad_id)
    if found != len(counts):
        raise ValueError(f"the chat template rendered {found} image pad(s) for {len(counts)} tool image(s)")
    out: list[int] = []
    left = iter(counts)
    for token in ids:
        out += [pad_id] * next(left) if token == pad_id else [token]
    return out


class ToolImages:
    """Tool images of a VL model: resized like prompt images, expanded to their image tokens, capped per trajectory.

    Args:
        prepare: ``image -> (image as vLLM and the processor get it, its number of image tokens)``: resized into
            ``data.min_pixels``/``data.max_pixels`` (both sides multiples of the patch factor, so neither vLLM nor the
            processor resizes it again) and ``grid_t * grid_h * grid_w / merge**2`` tokens (the processor's
            ``image_grid_thw``); built by ``easyrl.trainer.multi_turn``.
        pad_id: the ``<|image_pad|>`` id.
        limit: images per trajectory at most, prompt images included (``worker.rollout.limit_images``, vLLM's
            ``limit_mm_per_prompt``): a tool image beyond it is dropped and the tool message says so (a cap, not an
            error: a model that zooms too often reads why it sees no more images, and ``multi_turn/tool_images_dropped``
            counts them).
    """

    def __init__(self, prepare: Callable[[Image.Image], tuple[Image.Image, int]], pad_id: int, limit: int):
        self.prepare = prepare
        self.pad_id = pad_id
        self.limit = limit

    def attach(self, traj: Any, text: str, images: list[Image.Image]) -> dict[str, Any]:
        """The tool message of ``text`` and ``images``; the images that fit under the limit are prepared and
        appended to ``traj.images`` (and their token counts to ``traj.image_tokens``), in order."""
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
        """The tool turn ``ids`` with the pads of the trajectory's last ``new_images`` images expanded; if the turn
        does not fit in the trajectory's remaining budget, it is cut before the first image that does not fit whole
        (that image and the ones after it are dropped from ``traj``) and the trajectory ends."""
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
