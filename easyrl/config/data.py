"""``data:``: where the prompts come from and how they become model inputs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Optional

from annotated_types import Ge

from easyrl.config.fields import POSITIVE, POSITIVE_OR_OFF, Note, input_path
from easyrl.errors import ConfigError

VIDEO_FRAMES = Annotated[int, Ge(2), Note("Qwen-VL encodes a video's frames in pairs")]


@dataclass
class DataConfig:
    """Where the prompts come from and how they are turned into model inputs."""

    train_files: Optional[str] = input_path("hiyouga/geometry3k@train")
    """A hub id ``name@split``, a local parquet/json/jsonl file or folder, or a raw InterGPS geometry3k folder
    (null only for ``easyrl eval``, which needs no training data)."""
    val_files: Optional[str] = input_path("hiyouga/geometry3k@test")
    """Same forms as ``train_files``; null = no validation."""
    prompt_key: str = "problem"
    answer_key: str = "answer"
    image_key: Optional[str] = "images"
    """Column holding the images; null = text-only (no column is read as images)."""
    image_dir: Optional[str] = input_path()
    """Folder that relative image paths in the data are resolved against."""
    max_prompt_length: Annotated[int, POSITIVE] = 1024
    """Tokens, image tokens included; longer prompts are filtered out (``filter_overlong_prompts``)."""
    max_response_length: Annotated[int, POSITIVE] = 1024
    """Tokens generated per sample at most."""
    rollout_batch_size: Annotated[int, POSITIVE] = 512
    """Prompts per training step (each sampled ``worker.rollout.n`` times)."""
    val_batch_size: Annotated[int, POSITIVE_OR_OFF] = -1
    """Prompts per validation batch; -1 = the whole validation set at once."""
    format_prompt: Optional[str] = input_path()
    """Path of a Jinja2 template that receives ``content`` (the problem) and renders the user message."""
    system_prompt: Optional[str] = None
    """Text of a system message put before every prompt's user message (training and validation); null = none (the
    chat template's default system message, if it has one, stays)."""
    shuffle: bool = True
    seed: int = 1
    min_pixels: Annotated[int, POSITIVE] = 262144
    max_pixels: Annotated[int, POSITIVE] = 4194304
    filter_overlong_prompts: bool = True
    mini_rollout_batch_size: Optional[Annotated[int, POSITIVE]] = None
    """Prompts per generation round; None: ``rollout_batch_size``. With ``algorithm.online_filtering`` rounds of this
    size are generated until ``rollout_batch_size`` groups are kept; without it they are concatenated."""
    override_chat_template: Optional[str] = input_path()
    """Path of a Jinja chat template file that replaces the tokenizer's (and processor's) own."""
    video_key: Optional[str] = "videos"
    """Column holding each row's videos: file paths (relative ones under ``image_dir``) or lists of frame images;
    ``<video>`` in the prompt places them (docs/data.md, Videos). null: no column is read as videos."""
    video_fps: Annotated[float, POSITIVE] = 2.0
    """Frames per second sampled from a video file (qwen-vl-utils' ``fps``)."""
    video_min_frames: VIDEO_FRAMES = 4
    """Frames sampled from a video file at least (qwen-vl-utils' ``min_frames``), at most all it has."""
    video_max_frames: VIDEO_FRAMES = 768
    """Frames sampled from a video at most (qwen-vl-utils' ``max_frames``); a longer frame list is thinned evenly."""

    @property
    def generation_batch_size(self) -> int:
        """Prompts per generation round: ``mini_rollout_batch_size``, or ``rollout_batch_size`` when it is None."""
        return self.mini_rollout_batch_size or self.rollout_batch_size

    def check(self) -> None:
        """Raises ``ConfigError`` when ``min_pixels`` is above ``max_pixels`` or ``video_min_frames`` above
        ``video_max_frames``, or when ``image_dir`` is not a folder."""
        if self.min_pixels > self.max_pixels:
            raise ConfigError(f"data.min_pixels ({self.min_pixels}) is larger than data.max_pixels ({self.max_pixels}).")
        if self.video_min_frames > self.video_max_frames:
            raise ConfigError(f"data.video_min_frames ({self.video_min_frames}) is larger than data.video_max_frames "
                              f"({self.video_max_frames}): no frame count satisfies both.")
        if self.image_dir is not None and not os.path.isdir(os.path.expanduser(self.image_dir)):
            raise ConfigError(f"data.image_dir={self.image_dir!r} is not a folder: give the folder that relative image "
                              "and video paths of the data start from, or null for paths relative to the working "
                              "directory.")
