"""Images returned by tools (``easyrl.agents.tool_images``, ``easyrl.trainer.multi_turn``) with the tiny
Qwen2.5-VL's real processor, the real tool process pool and a scripted engine: the return-value convention, the tool
turn's tokens (image pads expanded exactly as the processor expands them), the engine's one-pad form, the actor's
inputs, the per-trajectory image limit, the budget cut, and the misuse errors (docs/errors.md A09, A10)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from easyrl.agents.executor import ToolExecutor
from easyrl.agents.tool_images import collapse_pads, expand_pads, split_images
from easyrl.agents.trajectory import Trajectory, TurnLoop
from easyrl.errors import ConfigError
from easyrl.trainer.multi_turn import tool_images_for
from easyrl.workers.vl_tokens import mm_token_type_ids, stray_pads

HERE = Path(__file__).parent / "agent_tools"
BOUNDS = dict(min_pixels=3136, max_pixels=12544, factor=28)  # examples/configs/cpu_demo.yaml


@pytest.fixture(scope="module")
def processor(tiny_model_path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_path("qwen2_5_vl"))


@pytest.fixture(scope="module")
def executor():
    pool = ToolExecutor({name: f"{HERE / 'image_tools.py'}:{name}" for name in ("paint", "snapshot", "not_an_image")},
                        30.0, 2)
    yield pool
    pool.close()


def _images(processor, limit=4):
    return tool_images_for(SimpleNamespace(processor=processor, **BOUNDS), limit)


def _loop(processor, executor, calls, images="vl", limit=4):
    tok = processor.tokenizer
    return TurnLoop(tok, lambda text: [dict(c) for c in calls], executor, max_assistant_turns=3,
                    images=_images(processor, limit) if images == "vl" else None)


def _engine(tok, seen):
    """Answers every turn with "ok" + <|im_end|> (log-prob -0.5 each); records the engine's view of each prompt."""
    def generate(active, round_):
        seen.append([list(t.prompt_ids + t.response_ids) for t in active])
        ids = tok.encode("ok", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        return [(ids, [-0.5] * len(ids)) for _ in active]
    return generate


def _prompt(tok):
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": "Paint."}], tokenize=False,
                                              add_generation_prompt=True), add_special_tokens=False)


def test_a_tool_returns_images_as_verl_tool_response_text_and_image_or_a_bare_image():
    image = Image.new("RGB", (8, 8))
    assert split_images({"text": "t", "image": [image]}) == ("t", [image])
    assert split_images({"image": image}) == ("", [image])
    assert split_images(image) == ("", [image])
    assert split_images({"text": "plain", "other": 1}) == ({"text": "plain", "other": 1}, [])  # no images: JSON
    with pytest.raises(TypeError, match="PIL.Image"):
        split_images({"text": "t", "image": ["/a/path.png"]})


def test_pads_collapse_for_the_engine_and_expand_for_the_actor():
    assert collapse_pads([1, 9, 9, 9, 2, 9, 9, 3], 9) == [1, 9, 2, 9, 3]
    assert expand_pads([1, 9, 2, 9, 3], 9, [3, 2]) == [1, 9, 9, 9, 2, 9, 9, 3]
    with pytest.raises(ValueError, match="1 image pad"):
        expand_pads([1, 9, 2], 9, [3, 2])


def test_tool_turn_tokens_are_the_processors_and_the_engine_gets_one_pad_per_image(processor, executor):
    tok = processor.tokenizer
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    traj = Trajectory(_prompt(tok), budget=200)
    seen: list = []
    _loop(processor, executor, [{"name": "paint", "arguments": {"text": "a cat"}}]).run([traj], _engine(tok, seen))
    assert traj.assistant_turns == 3 and traj.tool_images == 2 and len(traj.images) == 2
    # each image as the processor cuts it: 56 x 84 within [56*56, 112*112] stays 56 x 84, grid (1, 6, 4): 6 tokens
    grid = processor.image_processor(images=traj.images, return_tensors="pt")["image_grid_thw"]
    assert traj.image_tokens == (grid.prod(-1) // 4).tolist() == [6, 6]
    # the tool turn's tokens equal the processor's tokenization of the turn's text with that image
    first_end = traj.response_ids.index(tok.convert_tokens_to_ids("<|im_end|>")) + 1
    turn = traj.response_ids[first_end:first_end + traj.response_mask[first_end:].index(1)]
    text = tok.decode(collapse_pads(turn, pad))
    assert "<|im_start|>tool\n<|vision_start|><|image_pad|><|vision_end|>painted 5 chars<|im_end|>" in text
    assert turn == processor(text=[text], images=traj.images[:1], return_tensors="pt")["input_ids"][0].tolist()
    assert all(m == 0 for m in traj.response_mask[first_end:first_end + len(turn)])  # outside the loss
    assert traj.log_probs[first_end:first_end + len(turn)] == [0.0] * len(turn)
    # the engine's prompt of the last round: the response with ONE pad per image (vLLM expands it again)
    engine_ids = collapse_pads(traj.response_ids, pad)
    assert engine_ids.count(pad) == 2 and traj.response_ids.count(pad) == 12
    # the actor's inputs: the tool images' processor outputs after the prompt's
    prompt_inputs = processor(text=["x<|vision_start|><|image_pad|><|vision_end|>"],
                              images=[Image.new("RGB", (56, 56))], return_tensors="pt")
    prompt_inputs = {k: prompt_inputs[k] for k in ("pixel_values", "image_grid_thw")}
    inputs = _images(processor).actor_inputs(prompt_inputs, traj.images)
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4], [1, 6, 4], [1, 6, 4]]
    assert inputs["pixel_values"].shape[0] == 16 + 24 + 24
    assert traj.messages[1]["content"] == [{"type": "image"}, {"type": "text", "text": "painted 5 chars"}]
    assert traj.stats()["tool_images"] == 2


def test_images_over_worker_rollout_limit_images_are_dropped_counted_and_told(processor, executor):
    tok = processor.tokenizer
    traj = Trajectory(_prompt(tok), budget=200, prompt_images=1)
    _loop(processor, executor, [{"name": "snapshot", "arguments": {}}], limit=2).run([traj], _engine(tok, []))
    assert traj.tool_images == 1 and traj.tool_images_dropped == 1  # 1 prompt image + 1 tool image = the limit
    assert "not shown: at most 2 images per conversation (worker.rollout.limit_images)" in traj.messages[3]["content"]
    assert traj.image_tokens == [4]  # 30 x 30 grows to 56 x 56 (data.min_pixels): 4 tokens


def test_a_tool_turn_cut_by_the_budget_ends_before_an_image_that_does_not_fit(processor, executor):
    tok = processor.tokenizer
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    traj = Trajectory(_prompt(tok), budget=10)
    _loop(processor, executor, [{"name": "paint", "arguments": {"text": "a"}}]).run([traj], _engine(tok, []))
    assert traj.done and traj.images == [] and traj.tool_images == 0 and pad not in traj.response_ids
    assert len(traj.response_ids) < 10


def test_an_image_from_a_tool_for_a_text_only_model_is_a_config_error(processor, executor):  # A09
    tok = processor.tokenizer
    traj = Trajectory(_prompt(tok), budget=200)
    with pytest.raises(ConfigError, match="the tool 'paint' returned 1 image.*text-only"):
        _loop(processor, executor, [{"name": "paint", "arguments": {"text": "a"}}], images=None).run(
            [traj], _engine(tok, []))


def test_a_tool_image_that_is_not_a_pil_image_is_a_counted_tool_error(processor, executor):  # A10
    tok = processor.tokenizer
    traj = Trajectory(_prompt(tok), budget=200)
    _loop(processor, executor, [{"name": "not_an_image", "arguments": {}}]).run([traj], _engine(tok, []))
    assert traj.tool_errors == 2 and traj.tool_images == 0
    assert traj.messages[1]["content"].startswith("Error: TypeError: a tool image must be a PIL.Image")


def test_the_pads_of_tool_images_are_visual_and_generated_pads_stray():
    ids = torch.tensor([[7, 9, 7, 9, 9, 7, 9]])  # prompt (3 tokens) then a tool image (2 pads) and a sampled pad
    response_mask = torch.tensor([[0, 0, 1, 1]])
    assert mm_token_type_ids(ids, 3, {9: 1}, response_mask).tolist() == [[0, 1, 0, 1, 1, 0, 0]]
    assert stray_pads(ids, 3, {9: 1}, response_mask).tolist() == [[False] * 6 + [True]]
    assert mm_token_type_ids(ids, 3, {9: 1}).tolist() == [[0, 1, 0, 0, 0, 0, 0]]  # without the mask: prompt only


def test_the_example_zoom_tool_returns_the_crop(tmp_path):
    import importlib.util

    path = tmp_path / "img.png"
    Image.new("RGB", (100, 60), (1, 2, 3)).save(path)
    example = Path(__file__).parents[1] / "examples" / "agents" / "image_tools.py"
    spec = importlib.util.spec_from_file_location("image_tools", example)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text, images = split_images(module.zoom(str(path), 0.5, 0.0, 1.0, 0.5))
    assert images[0].size == (50, 30) and text.startswith("zoomed into 50x30 pixels")


class _Engines:
    """Two scripted engines answering "ok" + <|im_end|>; record each round's requests."""

    rollout_dp_size = 2

    def __init__(self, tok):
        self.ids = tok.encode("ok", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        self.rounds = []

    def run_rollout(self, method, batch, **kwargs):
        self.rounds.append(batch)
        return [{"response_ids": [self.ids] * len(share), "response_log_probs": [[-1.0] * len(self.ids)] * len(share),
                 "timing_s/reshard": 0.0, "busy": 0, "offered": 0} for share in batch.chunk(self.rollout_dp_size)]

    def run_all(self, method):
        pass


def test_the_rollout_sends_the_engines_one_pad_per_image_and_all_images_and_the_actor_their_inputs(processor):
    from tensordict import TensorDict

    from easyrl.batch import Batch
    from easyrl.config import PPOConfig
    from easyrl.trainer.multi_turn import MultiTurnRollout, multi_turn_metrics

    tok = processor.tokenizer
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    config = PPOConfig()
    config.data.max_response_length = 80
    mt = config.worker.rollout.multi_turn
    mt.enable, mt.tools, mt.max_assistant_turns = True, [f"{HERE / 'image_tools.py'}:paint"], 3
    mt.format = f"{HERE / 'parser.py'}:paint_every_turn"
    engines = _Engines(tok)
    rollout = MultiTurnRollout(engines, config, tok, 0, _images(processor))
    rollout.patience = float("inf")  # the round barrier: this test reads the engine's rounds one by one
    prompt_image = Image.new("RGB", (56, 56))
    prompt_inputs = processor.image_processor(images=[prompt_image], return_tensors="pt")
    prompts = Batch(TensorDict({"prompts": torch.tensor([[1, 2], [3, 4]]), "prompt_mask": torch.ones(2, 2)},
                               batch_size=[2]),
                    {"raw_prompt_ids": [[1, 2], [3, 4]], "images": [[prompt_image], []],
                     "multi_modal_inputs": [dict(prompt_inputs), {}]})
    try:
        batch, _ = rollout.generate(prompts, None)
    finally:
        rollout.close()
    third = engines.rounds[2]  # after two tool turns
    assert [ids.count(pad) for ids in third["raw_prompt_ids"]] == [2, 2]  # one pad per tool image
    assert [len(images) for images in third["images"]] == [3, 2]  # the prompt's image, then the tools'
    assert third["images"][0][0] is prompt_image
    assert [(row == pad).sum().item() for row in batch["responses"]] == [12, 12]  # expanded: 6 tokens per image
    assert batch["multi_modal_inputs"][0]["image_grid_thw"].tolist() == [[1, 4, 4], [1, 6, 4], [1, 6, 4]]
    assert batch["multi_modal_inputs"][1]["image_grid_thw"].tolist() == [[1, 6, 4], [1, 6, 4]]
    assert [len(images) for images in batch["tool_images"]] == [2, 2]
    assert multi_turn_metrics(batch)["multi_turn/tool_images"] == 4.0
