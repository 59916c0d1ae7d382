"""Video loading and frame sampling for Qwen-VL prompts (``data.video_key`` / ``data.video_fps``); docs/data.md.

A video is a file path (decoded by OpenCV's FFmpeg backend) or a list of frame images. A file gives
``total / source_fps * fps`` frames clipped to ``[min_frames, max_frames]`` and ``total``, floored to an even count
(``temporal_patch_size = 2``), at ``linspace(0, total - 1, n).round()`` (qwen-vl-utils' ``smart_nframes``); a frame
list is already sampled at ``fps`` (thinned to ``max_frames``, an odd count padded with the last frame). Frames are
resized to one size with sides multiples of ``factor``, so the processor and vLLM (frame sampling off, the same
``metadata``) count the same ``n_frames / 2 * width * height / factor**2`` video tokens.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from easyrl.data.images import DEFAULT_FACTOR, load_image, target_size, to_rgb

FRAME_FACTOR = 2  # Qwen-VL's temporal patch: frames are encoded in pairs
VIDEO_PLACEHOLDER = "<video>"
BACKEND = "opencv"


@dataclass
class Video:
    """One sampled, resized video: ``frames`` ``(T, H, W, 3)`` uint8 RGB (``T`` even, sides multiples of ``factor``),
    ``metadata`` transformers' ``VideoMetadata`` fields (source ``fps``, ``total_num_frames``, ``frames_indices``,
    ``duration`` in s, ``width``/``height``, ``video_backend``)."""

    frames: np.ndarray
    metadata: dict[str, Any]

    def vllm_item(self) -> tuple[np.ndarray, dict[str, Any]]:
        """``(frames, metadata)`` as vLLM's Qwen-VL processors take a video, frame sampling off."""
        return self.frames, dict(self.metadata, do_sample_frames=False)


@dataclass(frozen=True)
class FrameLimits:
    """How videos are sampled: ``fps`` (``data.video_fps``), ``min_frames`` / ``max_frames``
    (``data.video_min_frames`` / ``data.video_max_frames``)."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768


def _floor_even(x: float) -> int:
    return int(math.floor(x / FRAME_FACTOR) * FRAME_FACTOR)


def frame_count(total: int, source_fps: float, limits: FrameLimits) -> int:
    """Frames sampled from a file of ``total`` frames at ``source_fps``; ValueError for fewer than 2 frames."""
    if total < FRAME_FACTOR:
        raise ValueError(f"it has {total} frame(s); a video needs at least {FRAME_FACTOR}")
    min_frames = int(math.ceil(limits.min_frames / FRAME_FACTOR) * FRAME_FACTOR)
    max_frames = _floor_even(min(limits.max_frames, total))
    wanted = total / source_fps * limits.fps if source_fps > 0 else min_frames
    return max(FRAME_FACTOR, _floor_even(min(max(wanted, min_frames), max_frames, total)))


def frame_indices(total: int, count: int) -> list[int]:
    """``count`` indices spread evenly over ``range(total)``, first and last included (``linspace(...).round()``)."""
    return [int(i) for i in np.linspace(0, total - 1, count).round().astype(int)]


def _open(path: str, first_frame: bool = False) -> tuple[Any, int, float, Any]:
    """``(capture, total frames, source fps, first frame or None)`` of a video file, the capture released with
    ``first_frame`` (frames then read through :func:`_grab`). ValueError for a missing or undecodable file."""
    import cv2

    if not os.path.isfile(path):
        raise ValueError(f"cannot read video file {path!r}: no such file")
    capture = cv2.VideoCapture(path)
    if not capture.isOpened():
        raise ValueError(f"cannot read video file {path!r}: not a video OpenCV/FFmpeg can decode")
    total, source_fps = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), capture.get(cv2.CAP_PROP_FPS)
    if not first_frame:
        return capture, total, source_fps, None
    ok, first = capture.read()
    capture.release()
    if not ok:
        raise ValueError(f"cannot read video file {path!r}: its first frame does not decode")
    return capture, total, source_fps, first


def _count(path: str, total: int, source_fps: float, limits: FrameLimits) -> int:
    try:
        return frame_count(total, source_fps, limits)
    except ValueError as err:
        raise ValueError(f"video file {path!r}: {err}") from None


def probe(video: Any, limits: FrameLimits) -> tuple[int, int, int]:
    """``(frames sampled, width, height)`` from a file's header and first frame, or every image of a frame list.
    ValueError for a missing or undecodable file or frame, or fewer than 2 frames (naming the video); TypeError for
    neither a path nor a list of frames."""
    if isinstance(video, (str, os.PathLike)):
        _, total, source_fps, first = _open(os.fspath(video), first_frame=True)
        return _count(os.fspath(video), total, source_fps, limits), first.shape[1], first.shape[0]
    sizes = {_frame(frame, i).size for i, frame in enumerate(_frame_list(video))}  # all decoded, as images are
    if len(sizes) > 1:
        raise ValueError(f"the frames of a video have different sizes {sorted(sizes)}")
    (width, height), = sizes
    return _list_count(len(video), limits), width, height


def _frame(frame: Any, index: int):
    """Frame ``index`` of a frame list, loaded (a PIL image); an unreadable one is named with its index."""
    try:
        return load_image(frame)
    except ValueError as err:
        raise ValueError(f"frame {index} of a video given as a list of frames: {err}") from None


def _frame_list(video: Any) -> list:
    if not isinstance(video, (list, tuple)):
        raise TypeError(f"a video is a file path or a list of frame images, got {type(video).__name__}")
    if not video:
        raise ValueError("a video given as a list of frames has no frames")
    return list(video)


def _list_count(n: int, limits: FrameLimits) -> int:
    """Frames kept of a list of ``n``: all, thinned to ``max_frames`` (even), an odd count padded to even."""
    kept = min(n, max(FRAME_FACTOR, _floor_even(limits.max_frames)))
    return kept + kept % FRAME_FACTOR


def _grab(path: str, wanted: list[int]) -> tuple[list[np.ndarray], int]:
    """The RGB frames at the sorted indices ``wanted`` (only those decoded) and how many frames were grabbed."""
    import cv2

    capture = _open(path)[0]
    frames, position = [], 0
    try:
        while position <= wanted[-1] and capture.grab():
            if position in wanted:
                ok, frame = capture.retrieve()
                if not ok:
                    raise ValueError(f"cannot read video file {path!r}: frame {position} does not decode")
                frames.extend([cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)] * wanted.count(position))
            position += 1
    finally:
        capture.release()
    return frames, position


def _decode_file(path: str, limits: FrameLimits) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The sampled RGB frames of a file and its metadata, resampled once if the header overstated the frame count."""
    capture, total, source_fps, _ = _open(path)
    capture.release()
    for _ in range(2):
        wanted = frame_indices(total, _count(path, total, source_fps, limits))
        frames, grabbed = _grab(path, wanted)
        if grabbed > wanted[-1]:
            break
        total = grabbed  # the header promised more frames than the stream has: sample those that exist
    else:
        raise ValueError(f"cannot read video file {path!r}: its frames do not decode")
    metadata = {"fps": float(source_fps), "total_num_frames": total, "frames_indices": wanted,
                "duration": total / source_fps if source_fps > 0 else None, "video_backend": BACKEND}
    return frames, metadata


def _decode_list(video: list, limits: FrameLimits) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The frames of a frame list (thinned to ``max_frames``, padded to an even count), as a video at ``fps``."""
    kept = min(len(video), _list_count(len(video), limits))
    chosen = [video[i] for i in frame_indices(len(video), kept)] if kept < len(video) else list(video)
    frames = [np.asarray(to_rgb(_frame(frame, i))) for i, frame in enumerate(chosen)]
    if len(frames) % FRAME_FACTOR:
        frames.append(frames[-1])
    sizes = {frame.shape for frame in frames}
    if len(sizes) > 1:
        raise ValueError(f"the frames of a video have different sizes {sorted(s[:2] for s in sizes)}")
    count = len(frames)
    metadata = {"fps": float(limits.fps), "total_num_frames": count, "frames_indices": list(range(count)),
                "duration": count / limits.fps, "video_backend": BACKEND}
    return frames, metadata


def process_video(video: Any, limits: FrameLimits, min_pixels: int, max_pixels: int,
                  factor: int = DEFAULT_FACTOR, processor: Any = None) -> Video:
    """Load, sample and resize one video; each frame's area within :func:`video_pixel_bounds`. Raises as
    :func:`probe`, and ValueError for frames of different sizes."""
    if isinstance(video, (str, os.PathLike)):
        frames, metadata = _decode_file(os.fspath(video), limits)
    else:
        frames, metadata = _decode_list(_frame_list(video), limits)
    height, width = frames[0].shape[:2]
    lo, hi = video_pixel_bounds(processor, min_pixels, max_pixels, len(frames))
    new_w, new_h = target_size(width, height, lo, hi, factor)
    if (new_w, new_h) != (width, height):
        from PIL import Image

        frames = [np.asarray(Image.fromarray(f).resize((new_w, new_h), Image.Resampling.BICUBIC)) for f in frames]
    metadata.update(width=new_w, height=new_h)
    return Video(np.stack(frames), metadata)


def probe_tokens(video: Any, limits: FrameLimits, min_pixels: int, max_pixels: int, factor: int = DEFAULT_FACTOR,
                 processor: Any = None) -> int:
    """The ``<|video_pad|>`` tokens :func:`process_video` will give ``video``, from :func:`probe`."""
    count, width, height = probe(video, limits)
    lo, hi = video_pixel_bounds(processor, min_pixels, max_pixels, count)
    return video_tokens(count, *target_size(width, height, lo, hi, factor), factor)


def video_tokens(n_frames: int, width: int, height: int, factor: int = DEFAULT_FACTOR) -> int:
    """``<|video_pad|>`` tokens of ``n_frames`` (even) frames of ``width x height`` (multiples of ``factor``)."""
    return n_frames // FRAME_FACTOR * (width // factor) * (height // factor)


def video_pixel_bounds(processor: Any, min_pixels: int, max_pixels: int, n_frames: int) -> tuple[int, int]:
    """Per-frame ``(min_pixels, max_pixels)``: the data bounds, ``max_pixels`` at most an even share of
    ``0.9 * max_video_tokens`` tokens' pixels over the frame pairs (not below ``min_pixels``)."""
    video_processor = getattr(processor, "video_processor", None)
    if video_processor is None:
        return min_pixels, max_pixels
    factor = int(getattr(video_processor, "patch_size", 14)) * int(getattr(video_processor, "merge_size", 2))
    budget = int(int(getattr(video_processor, "max_video_tokens", 128000) or 128000) * factor * factor * 0.9)
    return min_pixels, max(min(max_pixels, budget * FRAME_FACTOR // max(n_frames, 1)), min_pixels)
