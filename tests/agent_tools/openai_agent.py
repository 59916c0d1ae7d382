"""The e2e test's agent (``tests/test_e2e_agent.py``), written with the official ``openai`` client as a user would:
a tool-calling loop of three turns (tools offered on every request; a tool call is answered with the tool's result,
a reply without one with a user follow-up: the tiny random model never calls, so the follow-ups are what the e2e
sees; the first reply is replaced by a summary before the last request, so every session breaks there), and a
session that raises (the first call in the process: counted, the run goes on). It returns what it was served, every
reply's text, for the test to compare with the trained tokens. ``echo_turns`` is
bench/multi_turn_speed.py's agent (``--workload agent``)."""

import json
import os
import threading

import openai

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]

_LOCK = threading.Lock()
_CALLS = [0]


def run(task: dict, base_url: str, api_key: str, model: str) -> dict:
    with _LOCK:
        _CALLS[0] += 1
        first = _CALLS[0] == 1
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    if first:
        client.models.list()  # the endpoint answers; then the agent fails: counted in agent/failed
        raise RuntimeError("the test agent's planted failure")
    messages = [{"role": "user", "content": task["prompt"]}]
    replies = []
    for turn in range(3):
        if turn == 2:  # the history rewritten, as a framework that summarises it does: the session breaks here
            messages[1] = {"role": "assistant", "content": "(summary of the first reply)"}
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                               max_tokens=6).choices[0].message
        replies.append(reply.content or "")
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls or []:
            arguments = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])})
        if not reply.tool_calls:
            messages.append({"role": "user", "content": f"Check step {turn + 1} and go on."})
    return {"answer": replies[-1], "replies": replies}


def echo_turns(task: dict, base_url: str, api_key: str, model: str) -> dict:
    """The built-in multi-turn rollout's bench task as an agent (bench/multi_turn_speed.py ``--workload agent``):
    ``EASYRL_BENCH_TURNS`` assistant turns of at most ``EASYRL_BENCH_TURN_TOKENS`` tokens, each but the last answered
    as the ``echo`` test tool answers the built-in rollout's call (``tests/agent_tools/parser.py:echo_only``: the
    reply's first 8 characters), in a tool-response user turn."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
    turns, tokens = int(os.environ["EASYRL_BENCH_TURNS"]), int(os.environ["EASYRL_BENCH_TURN_TOKENS"])
    messages, replies = [{"role": "user", "content": task["prompt"]}], []
    for turn in range(turns):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=tokens).choices[0].message
        replies.append(reply.content or "")
        messages.append({"role": "assistant", "content": replies[-1]})
        if turn + 1 < turns:
            messages.append({"role": "user", "content": f"<tool_response>\necho: {replies[-1][:8]}\n</tool_response>"})
    return {"replies": replies}
