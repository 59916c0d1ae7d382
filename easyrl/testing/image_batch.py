"""A padded batch of prompts with images, made by the run's data path (``RLDataset``: the chat template, the image
resize, the model's processor), for the VL families' parity (``easyrl.trainer.parity``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from easyrl.batch import Batch

IMAGE_SIZES = ((96, 64), (64, 64), (80, 112))  # (width, height): one image per prompt, of different shapes
RESPONSE_LENGTHS = (6, 9, 3)


def image_batch(model_path: str | Path, seed: int = 0) -> Batch:
    """Three prompts with one random image each (``IMAGE_SIZES``) and random response ids in [10, 5000), left-padded
    prompts and right-padded responses as the trainer holds them; extras ``multi_modal_inputs`` (the processor's
    outputs), ``raw_prompt_ids`` (one placeholder per image, what vLLM is given) and ``images``."""
    import datasets
    from tensordict import TensorDict
    from transformers import AutoProcessor

    from easyrl.data.dataset import RLDataset

    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for w, h in IMAGE_SIZES]
    rows = datasets.Dataset.from_dict({"problem": ["<image>What is shown here?", "Describe <image> briefly.",
                                                   "<image>Which colour dominates?"],
                                       "answer": ["a", "b", "c"], "images": [[image] for image in images]})
    processor = AutoProcessor.from_pretrained(model_path)
    dataset = RLDataset("parity", processor.tokenizer, processor, rows=rows, max_prompt_length=4096,
                        min_pixels=32 * 32, max_pixels=128 * 128)
    items = [dataset[i] for i in range(len(rows))]
    g = torch.Generator().manual_seed(seed)
    width_p, width_r = max(len(item["prompt_ids"]) for item in items), max(RESPONSE_LENGTHS)
    ids = torch.zeros(len(items), width_p + width_r, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (item, r) in enumerate(zip(items, RESPONSE_LENGTHS)):
        p = len(item["prompt_ids"])
        ids[i, width_p - p:width_p] = torch.tensor(item["prompt_ids"])
        ids[i, width_p:width_p + r] = torch.randint(10, 5000, (r,), generator=g)
        mask[i, width_p - p:width_p + r] = 1
    tensors = TensorDict({"input_ids": ids, "attention_mask": mask, "responses": ids[:, width_p:].clone(),
                          "response_mask": mask[:, width_p:].clone()}, batch_size=[len(ids)])
    return Batch(tensors, {"multi_modal_inputs": [item["multi_modal_inputs"] for item in items],
                           "raw_prompt_ids": [item["raw_prompt_ids"] for item in items],
                           "images": [item["images"] for item in items]})
