"""Prompt datasets for RL: each row of a source (``easyrl.data.sources``) as token ids + images (+ videos)."""

from __future__ import annotations

import logging
import os
from typing import Any

import datasets
import torch
from PIL import Image

from easyrl.data.checks import check_columns, check_image_column, is_missing_answer
from easyrl.data.images import DEFAULT_FACTOR, load_image, process_image, target_size
from easyrl.data.intergps import IMAGE_PLACEHOLDER
from easyrl.data.prompts import load_format_prompt, user_content
from easyrl.data.sources import load_source
from easyrl.data.videos import VIDEO_PLACEHOLDER, FrameLimits, probe_tokens, process_video
from easyrl.errors import ConfigError, DataError

logger = logging.getLogger("easyrl.data")

# Processor outputs aligned with the prompt's tokens, (1, prompt_len), kept out of `multi_modal_inputs` (the trainer
# derives `mm_token_type_ids` over the padded prompt + response).
TOKEN_ALIGNED_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")


def _pixel_bounds(processor: Any, min_pixels: int, max_pixels: int) -> tuple[int, int, int]:
    """``(min_pixels, max_pixels, factor)``: the data bounds intersected with the image processor's own; only an
    area-resizing processor (a ``merge_size``: Qwen-VL's) has bounds to intersect, the others (tiles, longest edges)
    resize the given image themselves, the same way for the actor and vLLM."""
    image_processor = getattr(processor, "image_processor", None)
    merge = getattr(image_processor, "merge_size", None)
    if image_processor is None or not isinstance(merge, int):
        return min_pixels, max_pixels, DEFAULT_FACTOR
    factor = int(getattr(image_processor, "patch_size", 14)) * merge
    size = getattr(image_processor, "size", None) or {}
    lo = getattr(image_processor, "min_pixels", None) or size.get("shortest_edge")
    hi = getattr(image_processor, "max_pixels", None) or size.get("longest_edge")
    new_min = max(min_pixels, int(lo)) if lo else min_pixels
    new_max = min(max_pixels, int(hi)) if hi else max_pixels
    if new_min > new_max:
        raise ConfigError(
            f"data.min_pixels/max_pixels [{min_pixels}, {max_pixels}] do not overlap the image processor's "
            f"[{lo}, {hi}]; choose bounds inside the processor's"
        )
    if (new_min, new_max) != (min_pixels, max_pixels):
        logger.warning(
            "data pixel bounds [%d, %d] narrowed to [%d, %d] to fit the image processor's own bounds",
            min_pixels, max_pixels, new_min, new_max,
        )
    return new_min, new_max, factor


def _image_size(image: Any) -> tuple[int, int]:
    """``(width, height)``, decoding every pixel so that a truncated file fails here."""
    if isinstance(image, Image.Image):
        return image.size
    return load_image(image).size  # raises the clear "cannot read ..." error (or TypeError)


class RLDataset(torch.utils.data.Dataset):
    """Prompts for RL rollouts: each row becomes the actor's token ids, vLLM's token ids, images, videos and answer.

    The ``prompt_key`` text, rendered by the ``format_prompt`` template, is the user message (after
    ``system_prompt``); its ``<image>``/``<video>`` placeholders place the media (none: media first); the chat template
    is applied with ``add_generation_prompt=True``. A text-only model (``processor=None``) drops the media. Keyword
    arguments are the ``data.*`` keys of the same names; ``max_prompt_length`` counts image and video tokens;
    ``filter_overlong_prompts`` drops longer rows at construction (else none is dropped or truncated); ``tools`` are
    JSON schemas for the chat template; ``rows`` replaces loading ``data_path``. Construction raises
    ``FileNotFoundError`` (data file, folder, template), ``DataError`` (a missing column, naming it, the source and the
    config key; a malformed row) or ``ConfigError`` (pixel bounds that do not overlap the processor's).
    """

    def __init__(self, data_path: str, tokenizer: Any, processor: Any = None, *, prompt_key: str = "problem",
                 answer_key: str = "answer", image_key: str | None = "images", image_dir: str | None = None,
                 max_prompt_length: int = 1024, format_prompt: str | None = None, min_pixels: int = 262144,
                 max_pixels: int = 4194304, filter_overlong_prompts: bool = True, system_prompt: str | None = None,
                 video_key: str | None = None, video_limits: FrameLimits = FrameLimits(),
                 tools: list[dict] | None = None, rows: datasets.Dataset | None = None):
        self.data_path = data_path
        self.tokenizer = tokenizer
        self.processor = processor
        self.prompt_key, self.answer_key, self.image_key = prompt_key, answer_key, image_key
        self.image_dir = image_dir
        self.max_prompt_length = max_prompt_length
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.tools = tools or None  # JSON schemas rendered by the chat template (worker.rollout.multi_turn.tools)
        self.format_prompt = load_format_prompt(format_prompt)
        if processor is not None:
            self.min_pixels, self.max_pixels, self.factor = _pixel_bounds(processor, min_pixels, max_pixels)
        else:
            self.min_pixels, self.max_pixels, self.factor = min_pixels, max_pixels, DEFAULT_FACTOR

        self.dataset = load_source(data_path) if rows is None else rows
        check_columns(self.dataset, data_path, prompt_key, answer_key)
        columns = self.dataset.column_names
        self.has_images = image_key is not None and image_key in columns
        self.video_key, self.video_limits = video_key, video_limits
        self.has_videos = video_key is not None and video_key in columns
        if self.has_videos and processor is None:
            logger.warning("%s: column %r (data.video_key) holds videos but the model is text-only: the videos are "
                           "dropped and <video> placeholders removed", data_path, video_key)
        check_image_column(self.dataset, image_key, prompt_key, data_path, text_only=processor is None)
        self.row_ids = list(range(len(self.dataset)))  # index in the source, for error messages
        self._scan_rows(filter_overlong_prompts)

    # -- row preparation ----------------------------------------------------------------------------------------

    def _row_media(self, row: dict, kind: str) -> list:
        """The row's raw images or videos (``kind``; a video is a path or a frame list) before loading, relative paths
        resolved against ``image_dir``."""
        value = row[getattr(self, f"{kind}_key")] if getattr(self, f"has_{kind}s") else None
        if self.processor is None or value is None or (isinstance(value, (str, list, tuple)) and not value):
            return []
        items = list(value) if isinstance(value, (list, tuple)) else [value]  # one path or image: one item
        if self.image_dir is not None:
            items = [[self._resolve(f) for f in v] if isinstance(v, (list, tuple)) else self._resolve(v) for v in items]
        return items

    def _resolve(self, image: Any) -> Any:
        if isinstance(image, str) and not os.path.isabs(image):
            return os.path.join(self.image_dir, image)
        if isinstance(image, dict) and image.get("bytes") is None and image.get("path"):
            path = image["path"]
            return {"bytes": None, "path": path if os.path.isabs(path) else os.path.join(self.image_dir, path)}
        return image

    def _missing_column(self, kind: str) -> str:
        """How a row's ``kind`` (image/video) column is named in a placeholder-count error."""
        key = getattr(self, f"{kind}_key")
        if getattr(self, f"has_{kind}s"):
            return f"column {key!r} (data.{kind}_key)"
        if key:
            return f"no {kind} column {key!r} in {self.data_path!r} (set data.{kind}_key)"
        return f"data.{kind}_key is null (set it to the column of the {kind}s)"

    def _prompt_text(self, row: dict, n_images: int, n_videos: int = 0) -> str:
        """The chat-templated prompt with one image (video) placeholder token per image (video)."""
        content = row[self.prompt_key]
        if not isinstance(content, str):
            raise ValueError(f"column {self.prompt_key!r} holds a {type(content).__name__}, not a string: write the "
                             "prompt's text as one string in that column (a list of chat messages or parts is not "
                             "read), or set data.prompt_key to the column that holds it")
        if not content.strip() and not n_images + n_videos:
            raise ValueError(f"column {self.prompt_key!r} (data.prompt_key) is empty: the model would answer nothing; "
                             "write the problem's text in that row, or remove the row")
        text = self.format_prompt(content)
        if self.processor is None:
            message: Any = text.replace(IMAGE_PLACEHOLDER, "").replace(VIDEO_PLACEHOLDER, "")
        else:
            message = user_content(text, n_images, n_videos, self._missing_column)
        templater = self.processor if getattr(self.processor, "chat_template", None) else self.tokenizer
        return templater.apply_chat_template(
            self.system + [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True,
            **({"tools": self.tools} if self.tools else {}),
        )

    def _scan_rows(self, filter_overlong: bool) -> None:
        """Check every row once (prompt, answer, placeholders, media decode) and count its prompt tokens without the
        processor; with ``filter_overlong`` drop the rows above ``max_prompt_length``. DataError for the first bad row
        (index, source, column) or when every row is too long."""
        columns = [self.prompt_key, self.answer_key] + ([self.image_key] if self.has_images else []) + (
            [self.video_key] if self.has_videos else [])
        view = self.dataset.select_columns(list(dict.fromkeys(columns)))
        feature = view.features.get(self.image_key) if self.has_images else None
        if isinstance(getattr(feature, "feature", None), datasets.Image):  # decode ourselves, to name the row
            view = view.cast_column(self.image_key, datasets.Sequence(datasets.Image(decode=False)))
        elif isinstance(feature, datasets.Image):
            view = view.cast_column(self.image_key, datasets.Image(decode=False))
        keep = []
        self.max_videos = 0  # videos in one row at most (vLLM's limit_mm_per_prompt)
        self.max_images, self.max_images_row = 0, None  # images in one kept row at most, and the first such row
        for index, row in enumerate(view):
            try:
                if is_missing_answer(row[self.answer_key]):
                    raise DataError(f"column {self.answer_key!r} (data.answer_key) is empty: write the reference "
                                    "answer the reward compares against (a non-blank string or number) in that row, "
                                    "or remove the row")
                images, videos = self._row_media(row, "image"), self._row_media(row, "video")
                text = self._prompt_text(row, len(images), len(videos))
                length = len(self.tokenizer.encode(text, add_special_tokens=False))
                for image in images:
                    w, h = target_size(*_image_size(image), self.min_pixels, self.max_pixels, self.factor)
                    length += w * h // (self.factor * self.factor) - 1
                self.max_videos = max(self.max_videos, len(videos))
                for video in videos:  # its header and first frame (every frame is decoded when the row is used)
                    length += probe_tokens(video, self.video_limits, self.min_pixels, self.max_pixels, self.factor,
                                           self.processor) - 1
            except Exception as err:
                raise DataError(f"row {index} of {self.data_path!r}: {err}") from err
            if length <= self.max_prompt_length or not filter_overlong:
                keep.append(index)
                if len(images) > self.max_images:
                    self.max_images, self.max_images_row = len(images), index
        dropped = len(self.dataset) - len(keep)
        if dropped and not keep:
            raise DataError(
                f"all {dropped} prompts of {self.data_path!r} are longer than max_prompt_length="
                f"{self.max_prompt_length} tokens (image tokens included); raise data.max_prompt_length or lower "
                "data.max_pixels"
            )
        (logger.info if dropped else logger.debug)(  # a console line only when prompts were dropped
            "%s: filtered out %d of %d prompts longer than max_prompt_length=%d tokens",
            self.data_path, dropped, len(self.dataset), self.max_prompt_length,
        )
        if dropped:
            self.dataset = self.dataset.select(keep)
            self.row_ids = keep

    # -- torch Dataset --------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """One prompt: ``prompt_ids`` (the actor's, placeholders expanded to image tokens), ``raw_prompt_ids`` (vLLM's,
        one ``<|image_pad|>`` per image), ``images`` (RGB, resized), ``videos`` (:class:`~easyrl.data.videos.Video`),
        ``multi_modal_inputs`` (processor outputs besides ids and mask: ``pixel_values`` ``(n_patches, patch_dim)``,
        ``image_grid_thw`` ``(n_images, 3)``, ``pixel_values_videos``, ``video_grid_thw``, ...), ``ground_truth``
        (str) and ``columns`` (:meth:`reward_columns`). DataError for a malformed row, naming its index."""
        row = self.dataset[index]
        try:
            return self._build(row)
        except Exception as err:
            raise DataError(f"row {self.row_ids[index]} of {self.data_path!r}: {err}") from err

    def _build(self, row: dict) -> dict[str, Any]:
        images = [process_image(image, self.min_pixels, self.max_pixels, self.factor)
                  for image in self._row_media(row, "image")]
        videos = [process_video(video, self.video_limits, self.min_pixels, self.max_pixels, self.factor,
                                self.processor) for video in self._row_media(row, "video")]
        text = self._prompt_text(row, len(images), len(videos))
        raw_prompt_ids = self.tokenizer.encode(text, add_special_tokens=False)
        multi_modal_inputs: dict[str, torch.Tensor] = {}
        if images or videos:
            kwargs: dict[str, Any] = {"images": images} if images else {}
            if videos:  # already sampled: the processor keeps every frame (easyrl.data.videos)
                kwargs.update(videos=[v.frames for v in videos], video_metadata=[v.metadata for v in videos],
                              videos_kwargs={"do_sample_frames": False, "size": {
                                  "shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}})
            inputs = self.processor(text=[text], return_tensors="pt", **kwargs)
            prompt_ids = inputs["input_ids"][0].tolist()
            multi_modal_inputs = {k: v for k, v in inputs.items() if k not in TOKEN_ALIGNED_KEYS}
        else:
            prompt_ids = list(raw_prompt_ids)
        return {
            "prompt_ids": prompt_ids,
            "raw_prompt_ids": raw_prompt_ids,
            "images": images,
            "videos": videos,
            "multi_modal_inputs": multi_modal_inputs,
            "ground_truth": str(row[self.answer_key]),  # checked at construction (_scan_rows)
            "columns": self.reward_columns(row),
        }

    def reward_columns(self, row: dict) -> dict[str, Any]:
        """The row's columns for ``easyrl.rewards.styles``: all but the media, the prompt under the name ``prompt``."""
        columns = {key: value for key, value in row.items()
                   if key not in (self.image_key, self.prompt_key, self.video_key)}
        columns["prompt"] = row.get(self.prompt_key)
        return columns


def collate_fn(features: list[dict[str, Any]]) -> dict[str, list]:
    """``RLDataset`` items as ``{key: [value per item]}`` (no padding); ValueError for an empty batch or other keys."""
    if not features:
        raise ValueError("collate_fn got an empty batch")
    keys = list(features[0])
    for i, feature in enumerate(features):
        if list(feature) != keys:
            raise ValueError(f"batch item {i} has keys {sorted(feature)}, item 0 has {sorted(keys)}")
    return {key: [feature[key] for feature in features] for key in keys}
