"""End to end on the CPU: one GRPO step with video prompts (EasyR1's ``data.video_key``), 2 Ray workers, vLLM and the
FSDP2 actor on the tiny Qwen2.5-VL; the videos are generated here: two small mp4 files (decoded by OpenCV, sampled at
``data.video_fps``) and two lists of PNG frames.

One trainer for the module (~2 minutes of start-up on 2 cores); the assertions share it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from easyrl.testing.tiny import VIDEO_TOKEN_ID
from easyrl.testing.worker import InspectableWorker, actor_log_probs_of

pytestmark = pytest.mark.e2e

LOGPROB_TOL = 1e-4  # as tests/test_e2e_grpo.py (float32 on both sides; measured gaps ~1e-6)


def _write_videos(root: Path) -> Path:
    """Two mp4 files (16 frames at 8 fps, 2 s; sampled at ``data.video_fps=4``: 8 frames, Qwen2.5-VL's
    ``second_per_grid_ts`` 0.5, not its default 1) and two lists of 3 PNG frames (padded to 4), of noise; returns the
    data file."""
    import cv2

    rng = np.random.default_rng(0)
    for name, (w, h) in (("a.mp4", (96, 64)), ("b.mp4", (64, 80))):
        writer = cv2.VideoWriter(str(root / name), cv2.VideoWriter_fourcc(*"mp4v"), 8.0, (w, h))
        for _ in range(16):
            writer.write(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        writer.release()
    for clip in ("c", "d"):
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (72, 72, 3), dtype=np.uint8)).save(root / f"{clip}{i}.png")
    rows = [
        {"problem": "<video>What moves in the clip?", "answer": "1", "videos": ["a.mp4"]},
        {"problem": "Count the frames of <video>.", "answer": "4", "videos": [["c0.png", "c1.png", "c2.png"]]},
        {"problem": "<video>Which color comes first?", "answer": "2", "videos": ["b.mp4"]},
        {"problem": "How long is the clip?", "answer": "3", "videos": [["d0.png", "d1.png", "d2.png"]]},
    ]
    path = root / "videos.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def video_trainer(e2e_config, trainer_on_ray, tmp_path_factory):
    root = tmp_path_factory.mktemp("video")
    data = _write_videos(root)
    config = e2e_config(
        "qwen2_5_vl", root / "runs", f"data.train_files={data}", "data.val_files=null", f"data.image_dir={root}",
        "data.video_fps=4", "data.max_prompt_length=192", "data.max_response_length=16",
        "worker.rollout.calculate_log_probs=true", "worker.rollout.limit_images=0", "trainer.max_steps=1",
        "trainer.val_freq=-1",
    )
    assert config.worker.rollout.limit_videos == 0  # raised from the data at start-up
    with trainer_on_ray(config, InspectableWorker) as trainer:
        yield trainer


def test_one_grpo_step_on_videos(video_trainer):
    """vLLM's log-probs of its own samples equal the actor's: the same video tokens at the same mRoPE positions."""
    trainer = video_trainer
    assert trainer.config.worker.rollout.limit_videos == 1
    trainer.global_step = 1
    metrics = trainer.train_step(iter(trainer.train_dataloader))
    batch = trainer.last_batch
    assert metrics["rollout/log_prob_diff_max"] < LOGPROB_TOL, metrics["rollout/log_prob_diff_max"]
    # every prompt holds its video's tokens: t/2 * h * w / 4 pads, from the processor's grid
    pads = (batch["prompts"] == VIDEO_TOKEN_ID).sum(-1)
    grids = torch.stack([inputs["video_grid_thw"].prod(-1).sum() // 4 for inputs in batch["multi_modal_inputs"]])
    assert (pads == grids).all() and (pads > 0).all(), (pads, grids)
    seconds = [inputs["second_per_grid_ts"].tolist() for inputs in batch["multi_modal_inputs"]]
    assert all(s == [0.5] for s in seconds), seconds  # Qwen2.5-VL's time axis: 2 frames per 1/4 s grid step
    assert metrics["critic/advantages/max"] > 0  # the step trained on the video prompts


def test_vllm_matches_actor_on_a_video_prompt(video_trainer):
    """A fixed video+text sequence scores alike in vLLM and the FSDP2 actor, token by token; a stray
    ``<|video_pad|>`` in a response is scored as the text token it is (no "video features and video tokens do not
    match")."""
    trainer = video_trainer
    features = next(iter(trainer.train_dataloader))
    prompts = trainer.generator.prompt_batch(features, 2, trainer.global_step)
    batch = trainer.generator.generate(prompts, overrides=None, timing={})  # also syncs the actor's weights
    response = trainer.tokenizer.encode(" The answer is \\boxed{4}.", add_special_tokens=False)
    actor = actor_log_probs_of(trainer, batch, response)

    prompt_ids = features["prompt_ids"][0]
    assert prompt_ids.count(VIDEO_TOKEN_ID) > 1
    expanded, vllm_scores = trainer.workers.run_all(
        InspectableWorker.rollout_score, features["raw_prompt_ids"][0] + response, features["images"][0],
        features["videos"][0])[0]
    assert expanded == prompt_ids + response  # vLLM expanded the video pad exactly like the processor
    vllm_response = torch.tensor(vllm_scores[len(prompt_ids) - 1:])
    assert vllm_response.shape == actor.shape
    assert (vllm_response - actor).abs().max().item() < LOGPROB_TOL
    assert actor.min() < -1.0  # a random model: real, non-trivial log-probs

    stray = response[:3] + [VIDEO_TOKEN_ID] + response[3:]
    with_pad = actor_log_probs_of(trainer, batch, stray)
    assert torch.isfinite(with_pad).all()
    assert (with_pad[:3] - actor[:3]).abs().max().item() < 1e-6  # the tokens before it see the same prefix
