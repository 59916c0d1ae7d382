"""Tool calls in the model's text: the Hermes/Qwen convention (``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>``, the format of the Qwen2.5/Qwen3/Qwen3-VL chat templates) or a user parser
``path/to/file.py:function`` (``worker.rollout.multi_turn.format``).

A parser takes the assistant turn's text and returns a list of calls, each ``{"name": str, "arguments": dict}``;
a call the model botched is returned as ``{"error": "why"}``, which the model then reads as the tool's answer (and
the rollout counts as a tool error). An empty list means a final answer.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from easyrl.agents.specs import load_callable

__all__ = ["hermes", "load_parser", "Parser"]

Parser = Callable[[str], list[dict[str, Any]]]

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def hermes(text: str) -> list[dict[str, Any]]:
    """Every ``<tool_call>{json}</tool_call>`` in ``text``, in order; bad JSON, a missing name or non-dict
    arguments give ``{"error": ...}`` (``arguments`` may also be a JSON string, as some models write it)."""
    calls: list[dict[str, Any]] = []
    for body in _HERMES.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as err:
            calls.append({"error": f"the tool call is not valid JSON ({err.msg} at char {err.pos})"})
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            calls.append({"error": 'the tool call has no "name"'})
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            calls.append({"error": f'the "arguments" of {call["name"]!r} are not a JSON object'})
            continue
        calls.append({"name": call["name"], "arguments": arguments})
    return calls


def load_parser(fmt: str) -> Parser:
    """The parser named by ``worker.rollout.multi_turn.format``: ``hermes`` or ``path/to/file.py:function``.

    Raises:
        ConfigError: see ``easyrl.agents.specs.load_callable``.
    """
    if fmt == "hermes":
        return hermes
    return load_callable(fmt, "worker.rollout.multi_turn.format", "fn(text)")
