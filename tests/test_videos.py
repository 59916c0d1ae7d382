"""Video input (easyrl.data.videos, RLDataset's video column): frame sampling as qwen-vl-utils does it, decoding of
mp4 files and frame lists, the prompt's ``<video>`` placeholders, the processor's video tokens, vLLM's request."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from easyrl.data.videos import FrameLimits, frame_count, frame_indices, probe_tokens, process_video
from easyrl.errors import DataError

VIDEO_PAD = 151656


def write_mp4(path: Path, frames: int, fps: float, size: tuple[int, int] = (96, 64)) -> Path:
    """An mp4 (OpenCV's mp4v) of ``frames`` frames of ``size`` (width, height), frame i filled with gray 16 * i."""
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
    for i in range(frames):
        writer.write(np.full((size[1], size[0], 3), 16 * i, np.uint8))
    writer.release()
    return path


@pytest.fixture(scope="module")
def vl(tiny_model_path):
    from transformers import AutoProcessor, AutoTokenizer

    path = tiny_model_path("qwen2_5_vl")
    return AutoTokenizer.from_pretrained(path), AutoProcessor.from_pretrained(path)


@pytest.mark.parametrize("total, source_fps, limits, expected", [
    (16, 8.0, FrameLimits(2.0, 4, 768), 4),  # 2 s at 2 fps
    (300, 30.0, FrameLimits(2.0, 4, 768), 20),  # 10 s at 2 fps
    (300, 30.0, FrameLimits(2.0, 4, 8), 8),  # max_frames
    (12, 30.0, FrameLimits(2.0, 4, 768), 4),  # 0.4 s: min_frames
    (3, 30.0, FrameLimits(2.0, 4, 768), 2),  # fewer frames than min_frames: all it has, floored to even
    (90, 30.0, FrameLimits(1.5, 4, 768), 4),  # 4.5 frames floored to even
])
def test_frame_count_is_qwen_vl_utils_smart_nframes(total, source_fps, limits, expected):
    assert frame_count(total, source_fps, limits) == expected


def test_frame_indices_spread_first_to_last_and_one_frame_is_refused():
    assert frame_indices(16, 4) == [0, 5, 10, 15]
    assert frame_indices(300, 20)[0] == 0 and frame_indices(300, 20)[-1] == 299
    with pytest.raises(ValueError, match="1 frame"):
        frame_count(1, 30.0, FrameLimits())


def _sampled_fps(video):
    return len(video.metadata["frames_indices"]) / video.metadata["total_num_frames"] * video.metadata["fps"]


def test_mp4_is_sampled_at_video_fps_and_resized_to_factor_multiples(tmp_path):
    path = write_mp4(tmp_path / "a.mp4", frames=16, fps=8.0)
    video = process_video(str(path), FrameLimits(2.0, 4, 768), 3136, 12544, factor=28)
    assert video.frames.shape == (4, 56, 84, 3) and video.frames.dtype == np.uint8
    assert video.metadata["frames_indices"] == [0, 5, 10, 15] and video.metadata["fps"] == 8.0
    assert _sampled_fps(video) == 2.0  # Qwen2.5-VL's second_per_grid_ts = 2 / 2.0
    means = video.frames.reshape(4, -1).mean(-1)
    assert np.allclose(means, [0, 80, 160, 240], atol=8)  # the frames at those indices (16 apart), in order
    frames, metadata = video.vllm_item()
    assert frames is video.frames and metadata["do_sample_frames"] is False


def test_frame_list_is_a_video_at_video_fps(tmp_path):
    paths = []
    for i in range(5):
        Image.new("RGB", (60, 60), (40 * i, 0, 0)).save(tmp_path / f"f{i}.png")
        paths.append(str(tmp_path / f"f{i}.png"))
    video = process_video(paths, FrameLimits(3.0, 4, 768), 3136, 12544, factor=28)
    assert video.frames.shape == (6, 56, 56, 3)  # 5 frames, the last repeated to an even count
    assert video.frames[:, 0, 0, 0].tolist() == [0, 40, 80, 120, 160, 160]
    assert _sampled_fps(video) == 3.0
    thinned = process_video(paths, FrameLimits(3.0, 4, 2), 3136, 12544, factor=28)
    assert thinned.frames[:, 0, 0, 0].tolist() == [0, 160]  # max_frames: first and last
    # the scan's token count (without the processor) agrees: 3 pairs, 1 pair, of 2 x 2 tokens
    assert probe_tokens(paths, FrameLimits(3.0, 4, 768), 3136, 12544, 28) == 3 * 4
    assert probe_tokens(paths, FrameLimits(3.0, 4, 2), 3136, 12544, 28) == 1 * 4
    Image.new("RGB", (30, 60)).save(tmp_path / "odd.png")
    with pytest.raises(ValueError, match="different sizes"):
        process_video(paths[:1] + [str(tmp_path / "odd.png")], FrameLimits(), 3136, 12544)


def test_dataset_places_videos_and_counts_their_tokens(vl, tmp_path, caplog):
    from easyrl.data.dataset import RLDataset

    tokenizer, processor = vl
    write_mp4(tmp_path / "a.mp4", frames=16, fps=8.0)
    Image.new("RGB", (56, 56)).save(tmp_path / "img.png")
    for i in range(2):
        Image.new("RGB", (56, 56), (0, 90 * i, 0)).save(tmp_path / f"f{i}.png")
    rows = [{"problem": "See <video> and <image>.", "answer": "1", "videos": ["a.mp4"], "images": ["img.png"]},
            {"problem": "What happens?", "answer": "2", "videos": [["f0.png", "f1.png"]], "images": []}]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    kwargs = dict(image_dir=str(tmp_path), min_pixels=3136, max_pixels=12544, max_prompt_length=1024,
                  video_key="videos", video_limits=FrameLimits(2.0, 4, 768))
    dataset = RLDataset(str(data), tokenizer, processor, **kwargs)
    assert dataset.max_videos == 1
    first, second = dataset[0], dataset[1]
    text = tokenizer.decode(first["raw_prompt_ids"])
    assert "See <|vision_start|><|video_pad|><|vision_end|> and <|vision_start|><|image_pad|>" in text
    assert first["raw_prompt_ids"].count(VIDEO_PAD) == 1
    assert first["prompt_ids"].count(VIDEO_PAD) == 4 // 2 * 2 * 3  # (t/2) x (56/28) x (84/28)
    assert set(first["multi_modal_inputs"]) >= {"pixel_values", "image_grid_thw", "pixel_values_videos",
                                                "video_grid_thw", "second_per_grid_ts"}
    assert first["multi_modal_inputs"]["second_per_grid_ts"].tolist() == [1.0]
    assert second["prompt_ids"].count(VIDEO_PAD) == 1 * 2 * 2  # 2 frames of 56 x 56: videos first, then the text
    assert tokenizer.decode(second["raw_prompt_ids"]).count("<|vision_end|>What happens?") == 1
    assert "videos" not in first["columns"]  # not a reward column
    single = tmp_path / "single.jsonl"  # a bare path, not a list: one video
    single.write_text(json.dumps({**rows[0], "videos": "a.mp4"}) + "\n")
    assert RLDataset(str(single), tokenizer, processor, **kwargs)[0]["prompt_ids"] == first["prompt_ids"]
    # the scan's length (header + first frame) is the processor's
    assert [probe_tokens(str(tmp_path / "a.mp4"), FrameLimits(2.0, 4, 768), 3136, 12544, 28, processor)] == [12]
    short = RLDataset(str(data), tokenizer, processor, **dict(kwargs, max_prompt_length=len(first["prompt_ids"])))
    assert len(short) == 2
    shorter = RLDataset(str(data), tokenizer, processor, **dict(kwargs, max_prompt_length=len(first["prompt_ids"]) - 1))
    assert len(shorter) == 1
    with caplog.at_level(logging.WARNING, logger="easyrl.data"):  # a text-only model: dropped, with a warning
        text_only = RLDataset(str(data), tokenizer, None, **kwargs)
    assert "data.video_key" in caplog.text and text_only[0]["videos"] == []
    assert "<video>" not in tokenizer.decode(text_only[0]["raw_prompt_ids"])
    with pytest.raises(DataError, match="row 0 .* 1 <video> placeholders but 0 videos: data.video_key is null"):
        RLDataset(str(data), tokenizer, processor, **dict(kwargs, video_key=None))  # null: no video column
    data.write_text(json.dumps(rows[1]) + "\n")
    ignored = RLDataset(str(data), tokenizer, processor, **dict(kwargs, video_key=None))
    assert ignored[0]["videos"] == [] and ignored.max_videos == 0 and VIDEO_PAD not in ignored[0]["prompt_ids"]


def test_vllm_request_and_engine_limit():
    from easyrl.config import RolloutConfig
    from easyrl.trainer.preflight import raise_video_limit
    from easyrl.workers.rollout import _request, engine_arguments

    video = SimpleNamespace(vllm_item=lambda: ("frames", {"do_sample_frames": False}))
    request = _request([1, 2], ["img"], [video])
    assert request["multi_modal_data"] == {"image": ["img"], "video": [("frames", {"do_sample_frames": False})]}
    assert "multi_modal_data" not in _request([1], [], None)
    config = RolloutConfig()
    assert engine_arguments("m", config, "cpu", 0, vision=True)["limit_mm_per_prompt"]["video"] == 0
    raise_video_limit(config, 2, "data.train_files")
    raise_video_limit(config, 1, "data.val_files")
    assert config.limit_videos == 2
    assert engine_arguments("m", config, "cpu", 0, vision=True)["limit_mm_per_prompt"] == {"image": 1, "video": 2}
    from easyrl.config.rerun import alters_training

    assert not alters_training("worker.rollout.limit_videos")  # raised from the data: a resume must not refuse it
