"""docs/errors.md, video entries (V..): a bad video in ``data.video_key`` ends in one ``easyrl: data error: ...`` line
naming the config key, the row and the file, when the datasets are built (before Ray), not as a crash mid-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from easyrl.config import load_config
from easyrl.trainer.preflight import load_dataset_for
from tests.test_videos import write_mp4

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vl(tiny_model_path):
    from transformers import AutoProcessor, AutoTokenizer

    path = tiny_model_path("qwen2_5_vl")
    return AutoTokenizer.from_pretrained(path), AutoProcessor.from_pretrained(path)


def _load(vl, rows: list[dict], root: Path):
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = load_config([f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m",
                          "data.format_prompt=null", f"data.image_dir={root}"])
    tokenizer, processor = vl
    return lambda: load_dataset_for("data.train_files", str(path), config, tokenizer, processor)


def _row(video) -> dict:
    return {"problem": "<video>What happens?", "answer": "1", "videos": [video]}


def test_missing_video_file(expect_user_error, vl, tmp_path):  # V01
    write_mp4(tmp_path / "good.mp4", frames=8, fps=4.0)
    expect_user_error(_load(vl, [_row("good.mp4"), _row("gone.mp4")], tmp_path), "data",
                      "data.train_files: row 1 of", f"cannot read video file '{tmp_path}/gone.mp4': no such file")


def test_unreadable_video_file(expect_user_error, vl, tmp_path):  # V02
    (tmp_path / "broken.mp4").write_bytes(b"not a video" * 100)
    expect_user_error(_load(vl, [_row("broken.mp4")], tmp_path), "data", "row 0 of",
                      f"cannot read video file '{tmp_path}/broken.mp4'", "not a video OpenCV/FFmpeg can decode")


def test_missing_frame_of_a_frame_list(expect_user_error, vl, tmp_path):  # V03
    Image.new("RGB", (56, 56)).save(tmp_path / "f0.png")
    expect_user_error(_load(vl, [_row(["f0.png", "f1.png"])], tmp_path), "data", "row 0 of",
                      f"frame 1 of a video given as a list of frames: cannot read image file '{tmp_path}/f1.png'")


def test_video_with_one_frame(expect_user_error, vl, tmp_path):  # V04
    write_mp4(tmp_path / "still.mp4", frames=1, fps=4.0)
    expect_user_error(_load(vl, [_row("still.mp4")], tmp_path), "data", "row 0 of", "still.mp4",
                      "it has 1 frame(s); a video needs at least 2")


def test_placeholders_do_not_match_videos(expect_user_error, vl, tmp_path):  # V05
    write_mp4(tmp_path / "a.mp4", frames=8, fps=4.0)
    row = {**_row("a.mp4"), "problem": "<video> then <video>?"}
    expect_user_error(_load(vl, [row], tmp_path), "data", "row 0 of", "2 <video> placeholders but 1 videos",
                      "column 'videos' (data.video_key)")


def test_video_that_is_not_a_path_or_frame_list(expect_user_error, vl, tmp_path):  # V06
    expect_user_error(_load(vl, [_row(7)], tmp_path), "data", "row 0 of",
                      "a video is a file path or a list of frame images, got int")
