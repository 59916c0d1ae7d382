"""End to end, multi-turn with tool images: one GRPO step on the tiny Qwen2.5-VL (real Ray + vLLM + FSDP2, fp32) where
every trajectory makes two tool turns, each returning an image (``tests/agent_tools/image_tools.py:paint``, called by
the plug-in parser ``tests/agent_tools/parser.py:paint_every_turn`` since a random model writes no tool calls), before
its last assistant turn: the images reach the next turn's vLLM prompt and the actor's inputs
(``easyrl.trainer.multi_turn``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import ImageOps

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent / "agent_tools"
FP32_LOGPROB_TOL = 1e-4  # fp32 vLLM (CPU) vs the fp32 FSDP2 actor, as tests/test_e2e_multi_turn.py


@pytest.fixture(scope="module")
def run(e2e_config, trainer_on_ray, tmp_path_factory):
    from easyrl.testing.worker import InspectableWorker

    config = e2e_config(
        "qwen2_5_vl", tmp_path_factory.mktemp("runs"),
        "data.val_files=null",
        "data.max_response_length=96",
        "worker.rollout.calculate_log_probs=true",
        "worker.rollout.limit_images=3",  # the prompt's image and two tool images
        f"worker.reward.reward_function={HERE / 'reward.py'}:compute_score",
        "worker.rollout.multi_turn.enable=true",
        f"worker.rollout.multi_turn.tools=[{HERE / 'image_tools.py'}:paint]",
        f"worker.rollout.multi_turn.format={HERE / 'parser.py'}:paint_every_turn",
        "worker.rollout.multi_turn.max_assistant_turns=3",
        "worker.rollout.multi_turn.max_turn_tokens=8",
    )
    with trainer_on_ray(config, InspectableWorker) as trainer:
        metrics = trainer.train_step(trainer.prompt_stream())
        yield trainer, metrics


def _sample(trainer, row: int = 0):
    """Row ``row`` of the last batch: the actor's prompt ids, response ids, response mask, the engine's prompt ids
    (one pad per image), and all its images (the prompt's, then the tools')."""
    from easyrl.agents.tool_images import collapse_pads

    batch = trainer.last_batch
    pad = trainer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    prompt = batch["prompts"][row][batch["prompt_mask"][row].bool()].tolist()
    valid = batch["attention_mask"][row, -batch["responses"].shape[1]:].bool()
    response = batch["responses"][row][valid].tolist()
    mask = batch["response_mask"][row][valid]
    engine = batch["raw_prompt_ids"][row] + collapse_pads(response, pad)
    return prompt, response, mask, engine, batch["images"][row] + batch["tool_images"][row]


def test_tool_images_reach_vllm_and_the_actor_with_log_prob_parity(run):
    trainer, metrics = run
    batch = trainer.last_batch
    assert metrics["multi_turn/assistant_turns/min"] == 3.0
    assert metrics["multi_turn/tool_images"] == 2 * len(batch) and metrics["multi_turn/tool_images_dropped"] == 0
    # vLLM's sampled-token log-probs equal the actor's over the whole multi-turn sequence, images included
    assert metrics["rollout/log_prob_diff_max"] < FP32_LOGPROB_TOL, metrics["rollout/log_prob_diff_max"]
    print({key: metrics[key] for key in ("rollout/log_prob_diff_max", "multi_turn/tool_images",
                                         "multi_turn/masked_token_share", "timing_s/gen", "timing_s/step")})
    pad = trainer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for row, inputs in enumerate(batch["multi_modal_inputs"]):
        grid = inputs["image_grid_thw"]
        assert grid.shape[0] == 3  # the prompt's image, then the two tool images: the actor sees them all
        assert inputs["pixel_values"].shape[0] == int(grid.prod(-1).sum())
        response = batch["responses"][row]
        tool_pads = int(((response == pad) & (batch["response_mask"][row] == 0)).sum())
        assert tool_pads == int(grid[1:].prod(-1).sum()) // 4 > 0  # every tool pad is a patch group of a tool image


def test_the_next_turns_vllm_prompt_holds_the_tool_images_pads_and_the_image_changes_it(run):
    from easyrl.testing.worker import InspectableWorker

    trainer, _ = run
    prompt, response, mask, engine, images = _sample(trainer)
    expanded, scores = trainer.workers.run_all(InspectableWorker.rollout_score, engine, images)[0]
    assert expanded == prompt + response  # vLLM expanded every tool image's pad exactly as the actor's sequence
    scores = torch.tensor(scores[len(prompt) - 1:])  # under the updated weights (rollout_score syncs them first)
    assert scores.shape == mask.shape and torch.isfinite(scores).all()
    # other pixels in the tool images (same sizes): the assistant tokens after the first tool image score differently
    other = images[:1] + [ImageOps.invert(image) for image in images[1:]]
    _, changed = trainer.workers.run_all(InspectableWorker.rollout_score, engine, other)[0]
    diff = (torch.tensor(changed[len(prompt) - 1:]) - scores).abs()
    pad = trainer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    first_image = response.index(pad)
    assert diff[:first_image].max() < FP32_LOGPROB_TOL  # before it: the same
    after = mask.bool().clone()
    after[:first_image] = False
    assert diff[after].max() > 1e-3, diff[after].max()  # the next turns read the image
    print(f"tool images: max |log-prob change| after the first tool image {diff[after].max():.3g}, "
          f"before it {diff[:first_image].max():.2g}")
