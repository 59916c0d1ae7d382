"""easyrl.models.mrope: the text after a Qwen2.5-VL video continues at vLLM's (and Qwen's reference) position."""

from __future__ import annotations

import numpy as np
import torch

from easyrl.models.mrope import continue_after_vision, text_after_vision


def _reference(start: int, grid: tuple[int, int, int], t_factor: float, after: int) -> np.ndarray:
    """vLLM's ``get_mrope_input_positions`` for text, one video of llm grid ``(t, h, w)``, text."""
    t, h, w = grid
    indices = np.indices((t, h, w))
    indices[0] = (indices[0] * t_factor).astype(np.int64)
    video = indices.reshape(3, -1) + start
    text = np.arange(after) + video.max() + 1
    return np.concatenate([np.broadcast_to(np.arange(start), (3, start)), video, np.broadcast_to(text, (3, after))], 1)


def test_real_qwen2_5_vl_positions_after_a_long_video_match_vllm(tiny_model_path):
    from transformers import AutoConfig, AutoProcessor, Qwen2_5_VLModel

    from easyrl.workers.vl_tokens import mm_token_type_ids, visual_pad_ids

    path = tiny_model_path("qwen2_5_vl")
    processor, config = AutoProcessor.from_pretrained(path), AutoConfig.from_pretrained(path)
    frames = np.random.default_rng(0).integers(0, 255, (8, 56, 84, 3), dtype=np.uint8)
    metadata = {"fps": 8.0, "total_num_frames": 16, "frames_indices": list(range(0, 16, 2))}  # sampled at 4 fps
    text = "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>What?<|im_end|>\n"
    out = processor(text=[text], videos=[frames], video_metadata=[metadata], return_tensors="pt",
                    videos_kwargs={"do_sample_frames": False, "size": {"shortest_edge": 3136, "longest_edge": 12544}})
    ids = torch.cat([torch.zeros((1, 2), dtype=torch.long), out["input_ids"]], dim=1)  # two left pads
    mask = (torch.arange(ids.shape[1]) >= 2).long()[None]
    types = mm_token_type_ids(ids, ids.shape[1], visual_pad_ids(config))

    class Model:  # the transformers methods, without weights
        get_rope_index = Qwen2_5_VLModel.get_rope_index
        get_vision_position_ids = Qwen2_5_VLModel.get_vision_position_ids

    model = Model()
    model.config = config
    kwargs = dict(video_grid_thw=out["video_grid_thw"], second_per_grid_ts=out["second_per_grid_ts"],
                  attention_mask=mask)
    start = int((types[0] == 2).nonzero()[0]) - 2
    t, h, w = out["video_grid_thw"][0].tolist()
    n = ids.shape[1] - 2
    reference = _reference(start, (t, h // 2, w // 2), 0.5 * config.vision_config.tokens_per_second,
                           n - start - t * h * w // 4)
    plain, _ = model.get_rope_index(ids, types, **kwargs)
    assert not (plain[:, 0, 2:].numpy() == reference).all()  # transformers 5's own rule differs after the video
    fixed, deltas = text_after_vision(model.get_rope_index)(ids, types, **kwargs)
    assert (fixed[:, 0, 2:].numpy() == reference).all()
    assert (fixed[:, 0, :2] == plain[:, 0, :2]).all()  # padding untouched
    assert deltas.tolist() == [[int(reference.max()) + 1 - n]]


def test_images_and_short_runs_are_unchanged():
    types = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0]])
    positions = torch.tensor([[0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5], [0, 1, 2, 3, 2, 3, 4, 5]])[:, None]
    assert torch.equal(continue_after_vision(positions, types), positions)
    video = torch.tensor([[0, 2, 2, 2, 2, 0, 0]])
    t_long = torch.tensor([[0, 1, 1, 5, 5, 2, 3], [0, 1, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 2, 3]])[:, None]
    assert continue_after_vision(t_long, video)[:, 0, 5:].tolist() == [[6, 7], [6, 7], [6, 7]]
