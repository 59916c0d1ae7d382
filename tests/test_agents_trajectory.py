"""The turn loop of a multi-turn rollout (``easyrl.agents.trajectory``, ``easyrl.agents.chat``) with the tiny Qwen2.5
tokenizer and a scripted engine: token-exact bookkeeping, the response mask, budgets, limits, the environment hook,
and the ``multi_turn/*`` metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from easyrl.agents.chat import turn_ids
from easyrl.agents.environment import load_environment
from easyrl.agents.executor import ToolExecutor
from easyrl.agents.parsers import hermes, load_parser
from easyrl.agents.trajectory import Trajectory, TurnLoop

HERE = Path(__file__).parent / "agent_tools"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path("qwen2_5"))


@pytest.fixture(scope="module")
def executor():
    pool = ToolExecutor({"add": f"{HERE / 'tools.py'}:add", "echo": f"{HERE / 'tools.py'}:echo"}, 10.0, 2)
    yield pool
    pool.close()


def _scripted(tokenizer, texts):
    """An engine that answers round r with ``texts[r]`` + ``<|im_end|>`` and log-prob -0.5 per token."""
    def generate(active, round_):
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = tokenizer.encode(texts[round_], add_special_tokens=False) + [end]
        return [(ids[: min(len(ids), t.remaining)], [-0.5] * min(len(ids), t.remaining)) for t in active]
    return generate


def test_tool_turn_tokens_are_the_template_delta(tokenizer):
    ids = turn_ids(tokenizer, [{"role": "tool", "content": "5"}], "<|im_end|>")
    assert tokenizer.decode(ids) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"


def test_two_tool_turns_then_a_final_answer(tokenizer, executor):
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    texts = [call, '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>', "The answer is 5."]
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "2+3?"}], tokenize=False,
                                                            add_generation_prompt=True), add_special_tokens=False)
    traj = TurnLoop(tokenizer, hermes, executor).run([Trajectory(list(prompt), 200)],
                                                      _scripted(tokenizer, texts))[0]
    assert traj.done and traj.assistant_turns == 3
    assert [m["role"] for m in traj.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert [c["result"] for c in traj.tool_calls] == ["5", "echo: hi"]
    # token-exact: the sequence is the rendered conversation, the generated ids kept as they were
    full = tokenizer.decode(list(prompt) + traj.response_ids)
    assert full.endswith("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n" + call.replace(
        '{"name": "add", "arguments": {"a": 2, "b": 3}}', '{"name": "echo", "arguments": {"text": "hi"}}')
        + "<|im_end|>\n<|im_start|>tool\necho: hi<|im_end|>\n<|im_start|>assistant\nThe answer is 5.<|im_end|>")
    # the mask is 1 exactly on the assistant's tokens, whose log-probs are the engine's
    trained = [i for i, m in enumerate(traj.response_mask) if m]
    assistant = tokenizer.decode([traj.response_ids[i] for i in trained])
    assert assistant == "".join(t + "<|im_end|>" for t in texts)
    assert all(lp == -0.5 for lp, m in zip(traj.log_probs, traj.response_mask) if m)
    assert all(lp == 0.0 for lp, m in zip(traj.log_probs, traj.response_mask) if not m)
    assert 0 < traj.response_mask.count(0) < len(traj.response_mask)


def test_budget_limits_and_environment(tokenizer, executor):
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    prompt = [1, 2, 3]
    # the budget cuts the second assistant turn: done, exactly budget tokens
    traj = TurnLoop(tokenizer, hermes, executor).run([Trajectory(prompt, 40)], _scripted(tokenizer, [call] * 5))[0]
    assert traj.done and len(traj.response_ids) == 40 == len(traj.response_mask) == len(traj.log_probs)
    # max_assistant_turns stops before running the last turn's tools
    traj = TurnLoop(tokenizer, hermes, executor, max_assistant_turns=2).run(
        [Trajectory(prompt, 500)], _scripted(tokenizer, [call] * 5))[0]
    assert traj.assistant_turns == 2 and len(traj.tool_calls) == 1
    # max_turn_tokens caps each turn; the environment asks once more, then ends
    env = load_environment(f"{HERE / 'environment.py'}:second_try")
    loop = TurnLoop(tokenizer, hermes, None, env, max_turn_tokens=3)
    assert loop.turn_budget(Trajectory(prompt, 500)) == 3
    traj = loop.run([Trajectory(prompt, 500)], _scripted(tokenizer, ["No.", "Still no."]))[0]
    assert [m["role"] for m in traj.messages] == ["assistant", "user", "assistant"] and traj.user_turns == 1
    assert traj.messages[1]["content"] == "Try again."


def test_calls_without_tools_and_plug_in_parser_are_answered_with_errors(tokenizer):
    parser = load_parser(f"{HERE / 'parser.py'}:echo_only")
    traj = TurnLoop(tokenizer, parser, None, max_assistant_turns=2).run(
        [Trajectory([1], 100)], _scripted(tokenizer, ["a", "b"]))[0]
    assert traj.tool_errors == 1 and traj.tool_calls[0]["status"] == "error"


def test_multi_turn_metrics_and_reward_inputs(tokenizer):
    from easyrl.batch import Batch
    from easyrl.config import RewardConfig
    from easyrl.trainer.multi_turn import multi_turn_metrics
    from easyrl.trainer.scoring import Scorer

    stats = [{"assistant_turns": 3, "user_turns": 0, "tool_calls": 2, "tool_errors": 1, "tool_timeouts": 1,
              "assistant_tokens": 6, "tokens": 10},
             {"assistant_turns": 1, "user_turns": 0, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0,
              "assistant_tokens": 2, "tokens": 2}]
    ids = tokenizer.encode("ab cd ef gh", add_special_tokens=False)
    responses = torch.tensor([ids + [0] * (6 - len(ids)), ids[:1] + [0] * 5])
    valid = (torch.arange(6) < torch.tensor([[len(ids)], [1]])).long()
    mask = valid.clone()
    mask[0, 1] = 0  # a tool token inside the response
    batch = Batch(TensorDict({"responses": responses, "response_mask": mask, "prompts": torch.ones(2, 2).long(),
                              "attention_mask": torch.cat([torch.ones(2, 2).long(), valid], 1)}, batch_size=[2]),
                  {"multi_turn_stats": stats, "messages": [[{"role": "assistant", "content": "x"}], []],
                   "tool_calls": [[{"name": "add"}], []], "ground_truth": ["1", "2"]})
    metrics = multi_turn_metrics(batch)
    assert metrics["multi_turn/assistant_turns/mean"] == 2.0 and metrics["multi_turn/assistant_turns/max"] == 3.0
    assert metrics["multi_turn/tool_errors"] == 1.0 and metrics["multi_turn/tool_timeouts"] == 1.0
    assert metrics["multi_turn/masked_token_share"] == pytest.approx(4 / 12)
    inputs = Scorer(RewardConfig(), tokenizer, lambda x: x).reward_inputs(batch)
    assert inputs[0]["response"] == "ab cd ef gh"  # the whole response, tool tokens included
    assert inputs[0]["messages"] == [{"role": "assistant", "content": "x"}]
    assert inputs[0]["tool_calls"] == [{"name": "add"}] and inputs[0]["response_length"] == len(ids) - 1


def test_a_turn_cut_before_its_end_is_followed_by_the_tool_turn_header(tokenizer, executor):
    def cut(active, round_):  # cut on an ordinary token (max_turn_tokens) that the template also has
        text = "<tool_call>{\"name\": \"echo\", \"arguments\": {\"text\": \".\"}}</tool_call> Hello."
        ids = tokenizer.encode(text, add_special_tokens=False)
        return [(ids, None) for _ in active]

    traj = TurnLoop(tokenizer, hermes, executor, max_assistant_turns=2).run([Trajectory([1], 200)], cut)[0]
    tool = [i for i, m in enumerate(traj.response_mask) if not m]
    assert tokenizer.decode([traj.response_ids[i] for i in tool]) == (
        "<|im_start|>tool\necho: .<|im_end|>\n<|im_start|>assistant\n")
