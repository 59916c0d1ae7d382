"""Tool calls in the model's text (``worker.rollout.multi_turn.format``): Hermes/Qwen ``<tool_call>{json}</tool_call>``
or a user parser ``path/to/file.py:function``. A parser returns ``[{"name": str, "arguments": dict}]``, a botched call
as ``{"error": "why"}`` (the model reads it as the tool's answer); an empty list is a final answer.
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
    """``hermes`` or the user parser ``path/to/file.py:function``; ConfigError as ``load_callable``."""
    if fmt == "hermes":
        return hermes
    return load_callable(fmt, "worker.rollout.multi_turn.format", "fn(text)")
