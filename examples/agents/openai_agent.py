"""An agent written against the OpenAI API, trained as it is (docs/agents.md, "Bring your agent"): a tool-calling loop
with the official ``openai`` client and the calculator of ``tools.py``. easyrl calls ``run`` once per sample with the
session's endpoint; the trajectory it trains is what the engines sampled for these requests, token for token.

    worker.rollout.agent.entry_point=examples/agents/openai_agent.py:run
"""

import json
import os
import sys

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # easyrl imports this file by path: its tools beside it
from tools import calculator  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly as written.",
    "parameters": {"type": "object", "properties": {"expression": {
        "type": "string", "description": "numbers, parentheses and + - * / % ** only"}}, "required": ["expression"]}}}]
MAX_TURNS = 4


def run(task: dict, base_url: str, api_key: str, model: str) -> str:
    """Answer ``task["prompt"]``, calling the calculator when the model asks; returns the final answer's text."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": task["prompt"]}]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return reply.content or ""
        for call in reply.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except Exception as err:  # the model's malformed call: it reads the error, as a person would
                result = f"error: {err}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return messages[-1].get("content") or ""
