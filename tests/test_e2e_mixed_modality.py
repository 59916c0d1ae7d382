"""A VL model on data that mixes image and text-only prompts: with 2 workers, one rank's micro-batches can hold
images while the other's hold none. FSDP2 gathers the vision blocks collectively, so the text-only rank must still
run its vision tower (a blank image, contributing 0), or the step hangs. The timeout turns a hang into a failure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from easyrl.workers.mm_staging import multi_modal_nbytes

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(900)
def test_image_and_text_prompts_on_different_ranks(e2e_config, trainer_on_ray, tmp_path):
    data = tmp_path / "mixed.jsonl"
    rows = [
        {"problem": "<image>Find m \\widehat A B.", "answer": "80", "images": ["11/img_diagram.png"]},
        {"problem": "What is 2 + 3?", "answer": "5", "images": []},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = e2e_config(
        "qwen2_5_vl", tmp_path,
        f"data.train_files={data}",
        "data.val_files=null",
        f"data.image_dir={REPO / 'examples/data/geometry3k_sample'}",
        "data.rollout_batch_size=2",
        "data.max_response_length=16",
        "worker.rollout.calculate_log_probs=true",
    )
    with trainer_on_ray(config) as trainer:
        metrics = trainer.train_step(trainer.prompt_stream())
        batch = trainer.last_batch
    with_images = [bool(mm) for mm in batch["multi_modal_inputs"]]
    assert with_images == [with_images[0]] * 4 + [not with_images[0]] * 4  # one prompt per rank, one of each kind
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["rollout/log_prob_diff_max"] < 2e-3  # the blank image changes no log-prob
    # staged once per step: the text-only rank staged an empty share, and the passes shipped no pixels again
    assert metrics["perf/multi_modal_bytes_to_workers"] == multi_modal_nbytes(batch["multi_modal_inputs"]) > 0
