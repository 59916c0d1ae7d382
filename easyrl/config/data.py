"""``data:``: where the prompts come from and how they become model inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class DataConfig:
    """Where the prompts come from and how they are turned into model inputs."""

    train_files: str = "hiyouga/geometry3k@train"
    """A hub id ``name@split``, a local parquet/json/jsonl file or folder, or a raw InterGPS geometry3k folder."""
    val_files: Optional[str] = "hiyouga/geometry3k@test"
    """Same forms as ``train_files``; null = no validation."""
    prompt_key: str = "problem"
    answer_key: str = "answer"
    image_key: Optional[str] = "images"
    """Column holding the images; null = text-only (no column is read as images)."""
    image_dir: Optional[str] = None
    """Folder that relative image paths in the data are resolved against."""
    max_prompt_length: int = 1024
    """Tokens, image tokens included; longer prompts are filtered out (``filter_overlong_prompts``)."""
    max_response_length: int = 1024
    """Tokens generated per sample at most."""
    rollout_batch_size: int = 512
    """Prompts per training step (each sampled ``worker.rollout.n`` times)."""
    val_batch_size: int = -1
    """Prompts per validation batch; -1 = the whole validation set at once."""
    format_prompt: Optional[str] = None
    """Path of a Jinja2 template that receives ``content`` (the problem) and renders the user message."""
    system_prompt: Optional[str] = None
    """Text of a system message put before every prompt's user message (training and validation); null = none (the
    chat template's default system message, if it has one, stays)."""
    shuffle: bool = True
    seed: int = 1
    min_pixels: int = 262144
    max_pixels: int = 4194304
    filter_overlong_prompts: bool = True
