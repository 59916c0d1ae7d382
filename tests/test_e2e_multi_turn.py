"""End to end, multi-turn: 2 GRPO steps on the tiny Qwen2.5 (real Ray + vLLM + FSDP2, fp32) where every trajectory
makes two tool turns before its last assistant turn (``easyrl.trainer.multi_turn``). A random model writes no tool
calls, so the tool-call parser is the plug-in ``tests/agent_tools/parser.py:every_turn``, which reads every assistant
turn as calls of three test tools: ``echo``, ``flaky`` (raises on its first call) and ``slow`` (hangs past the
1.5 s timeout on its first call)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent / "agent_tools"
FP32_LOGPROB_TOL = 1e-4  # fp32 vLLM (CPU) vs the fp32 FSDP2 actor, as tests/test_e2e_algorithms.py


@pytest.fixture(scope="module")
def run(e2e_text_config, trainer_on_ray, tmp_path_factory):
    marker_dir = tmp_path_factory.mktemp("tool_markers")
    os.environ["EASYRL_TEST_TOOL_DIR"] = str(marker_dir)  # flaky/slow misbehave once (tests/agent_tools/tools.py)
    tools = ",".join(f"{HERE / 'tools.py'}:{name}" for name in ("echo", "flaky", "slow"))
    config = e2e_text_config(
        tmp_path_factory.mktemp("runs"),
        "data.max_response_length=160",
        "trainer.max_steps=2",
        f"worker.reward.reward_function={HERE / 'reward.py'}:compute_score",
        "worker.rollout.multi_turn.enable=true",
        f"worker.rollout.multi_turn.tools=[{tools}]",
        f"worker.rollout.multi_turn.format={HERE / 'parser.py'}:every_turn",
        "worker.rollout.multi_turn.max_assistant_turns=3",
        "worker.rollout.multi_turn.max_turn_tokens=8",
        "worker.rollout.multi_turn.max_tool_response_length=24",
        "worker.rollout.multi_turn.tool_timeout_s=1.5",
    )
    try:
        with trainer_on_ray(config) as trainer:
            trainer.fit()
            metrics = Path(config.trainer.run_dir) / "metrics.jsonl"
            rows = [json.loads(line) for line in metrics.read_text().splitlines()]
            yield trainer, rows
    finally:
        os.environ.pop("EASYRL_TEST_TOOL_DIR", None)


def test_two_steps_with_two_tool_turns_per_trajectory_and_log_prob_parity(run):
    trainer, rows = run
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["multi_turn/assistant_turns/min"] == 3.0  # two tool turns, then the last assistant turn
        assert row["multi_turn/tool_calls_per_traj/mean"] == 6.0
        assert 0.0 < row["multi_turn/masked_token_share"] < 1.0
        # vLLM's log-probs vs the actor's over the whole multi-turn sequence, on the assistant tokens
        assert row["rollout/log_prob_diff_max"] < FP32_LOGPROB_TOL, row["rollout/log_prob_diff_max"]
    batch = trainer.last_batch
    assert all(len([m for m in msgs if m["role"] == "tool"]) == 6 for msgs in batch["messages"])


def test_failing_and_hanging_tools_are_counted_and_the_run_goes_on(run):
    _, rows = run
    assert sum(row["multi_turn/tool_errors"] for row in rows) == 1  # flaky raised once
    assert sum(row["multi_turn/tool_timeouts"] for row in rows) == 1  # slow hung once, was killed
    assert rows[-1]["step"] == 2 and rows[-1]["reward/tool_calls"] == 6.0  # the reward saw the tool calls


def test_tool_tokens_are_outside_the_loss(run):
    trainer, _ = run
    batch, tokenizer = trainer.last_batch, trainer.tokenizer
    resp_len = batch["responses"].shape[1]
    valid = batch["attention_mask"][:, -resp_len:].bool()
    mask = batch["response_mask"].bool()
    tool = valid & ~mask
    assert tool.any(dim=1).all()  # every trajectory has tool tokens inside its sequence
    for row in range(len(batch)):
        # the masked-out tokens are exactly the tool turns, the trained ones hold no tool turn
        tool_text = tokenizer.decode(batch["responses"][row][tool[row]])
        assert tool_text.count("<|im_start|>tool\n") == 6 and "echo: " in tool_text
        assert "<|im_start|>tool" not in tokenizer.decode(batch["responses"][row][mask[row]])
    # every quantity of the loss is 0 off the response mask: the actor's log-probs, the advantages
    assert torch.all(batch["old_log_probs"][tool] == 0) and torch.all(batch["advantages"][tool] == 0)
    assert torch.all(batch["rollout_log_probs"][tool] == 0)
    # the reward sits on the last assistant token (after which only tool/pad tokens could follow)
    last = torch.where(mask, torch.arange(resp_len), -1).max(dim=1).values
    scores = batch["token_level_scores"]
    assert torch.equal(scores.nonzero()[:, 1], last[scores.abs().sum(1) > 0])
    # the generations table shows the masked tool turns as such: one span per tool round (three tool messages each)
    from easyrl.trainer.metrics import generation_rows

    (shown,) = generation_rows(tokenizer, batch, 1)
    assert shown["response"].count("<masked>") == 2 and "echo: " in shown["response"].split("<masked>")[1]
