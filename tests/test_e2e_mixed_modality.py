"""A VL model on data that mixes image+video, image and text-only prompts: with 2 workers, one rank's micro-batches
hold images and videos (Qwen-VL runs the vision tower twice) while the other's hold an image or nothing. FSDP2 gathers
the vision blocks collectively, so every rank must run the tower as many times (blank images, contributing 0), or the
step hangs on NCCL/HCCL (review S2-B); the collective contract (on in the suite) fails the step naming the call."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from PIL import Image

from easyrl.workers.mm_staging import multi_modal_nbytes

# under `make test-slow` (the suite's time, docs/development.md); tests/test_e2e_video.py keeps a video step in the suite
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(900)
def test_image_video_and_text_prompts_on_different_ranks(e2e_config, trainer_on_ray, tmp_path):
    data = tmp_path / "mixed.jsonl"
    frames = [str(tmp_path / f"frame{i}.png") for i in range(2)]
    for i, frame in enumerate(frames):
        Image.new("RGB", (56, 56), (40 * i, 90, 200)).save(frame)
    image = "11/img_diagram.png"
    rows = [  # one rank: image+video, image; the other: text only, image (in this order: no shuffle, no balancing)
        {"problem": "<image>In <video>, find m \\widehat A B.", "answer": "80", "images": [image], "videos": [frames]},
        {"problem": "<image>Find m \\widehat A B.", "answer": "80", "images": [image], "videos": []},
        {"problem": "What is 2 + 3?", "answer": "5", "images": [], "videos": []},
        {"problem": "<image>Find x.", "answer": "3", "images": [image], "videos": []},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = e2e_config(
        "qwen2_5_vl", tmp_path,
        f"data.train_files={data}",
        "data.val_files=null",
        f"data.image_dir={REPO / 'examples/data/geometry3k_sample'}",
        "data.rollout_batch_size=4",
        "worker.rollout.n=2",
        "trainer.balance_batch=false",
        "data.shuffle=false",
        "data.max_response_length=16",
        "worker.rollout.calculate_log_probs=true",
    )
    with trainer_on_ray(config) as trainer:
        metrics = trainer.train_step(trainer.prompt_stream())
        batch = trainer.last_batch
    kinds = ["I" * ("pixel_values" in mm) + "V" * ("pixel_values_videos" in mm) for mm in batch["multi_modal_inputs"]]
    assert kinds == ["IV", "IV", "I", "I", "", "", "I", "I"], kinds  # rank 0's share, then rank 1's
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["rollout/log_prob_diff_max"] < 2e-3  # the blank image changes no log-prob
    # staged once per step: the passes shipped no pixels again
    assert metrics["perf/multi_modal_bytes_to_workers"] == multi_modal_nbytes(batch["multi_modal_inputs"]) > 0
