"""Tools from ``path/to/file.py:function`` with their JSON schemas, and tool-call parsers (``easyrl.agents``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from easyrl.agents.parsers import hermes, load_parser
from easyrl.agents.tools import load_tools
from easyrl.errors import ConfigError

TOOLS = Path(__file__).parent / "agent_tools" / "tools.py"


def test_schema_from_signature_and_docstring():
    tools = load_tools([f"{TOOLS}:add", f"{TOOLS}:echo"])
    assert list(tools) == ["add", "echo"]
    fn = tools["add"].schema["function"]
    assert fn["description"] == "Add two integers."
    assert fn["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first integer."}
    assert fn["parameters"]["required"] == ["a", "b"] and "return" not in fn
    assert tools["add"].fn(2, 3) == 5 and tools["add"].spec == f"{TOOLS}:add"


def test_tool_without_docstring_or_function_is_a_config_error():
    with pytest.raises(ConfigError, match="no_docstring.*docstring"):
        load_tools([f"{TOOLS}:no_docstring"])
    with pytest.raises(ConfigError, match="has no function 'nope'.*'add'"):
        load_tools([f"{TOOLS}:nope"])
    with pytest.raises(ConfigError, match="no file"):
        load_tools(["missing.py:add"])


def test_hermes_parses_qwen_tool_calls_and_reports_botched_ones():
    text = ('I will add. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
            '<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"hi\\"}"}</tool_call>'
            '<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "x", "arguments": [1]}</tool_call>')
    calls = hermes(text)
    assert calls[0] == {"name": "add", "arguments": {"a": 1, "b": 2}}
    assert calls[1] == {"name": "echo", "arguments": {"text": "hi"}}
    assert "not valid JSON" in calls[2]["error"]
    assert "no \"name\"" in calls[3]["error"] and "not a JSON object" in calls[4]["error"]
    assert hermes("The answer is 3.") == []


def test_parser_plug_in_from_a_file():
    assert load_parser("hermes") is hermes
    parser = load_parser(f"{Path(__file__).parent / 'agent_tools' / 'parser.py'}:echo_only")
    assert parser("hello world") == [{"name": "echo", "arguments": {"text": "hello wo"}}]
