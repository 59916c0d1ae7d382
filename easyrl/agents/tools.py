"""Tools: Python functions named ``path/to/file.py:function`` and their JSON schemas (the OpenAI/Hugging Face
function-calling format the chat templates of Qwen2.5/Qwen3/Qwen3-VL render as ``tools=``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from easyrl.agents.specs import load_callable
from easyrl.errors import ConfigError

__all__ = ["Tool", "load_tools"]


@dataclass
class Tool:
    """One tool: its spec (re-imported by the executor's processes), function and schema."""

    spec: str
    fn: Callable
    schema: dict[str, Any]


def load_tools(specs: list[str], key: str = "worker.rollout.multi_turn.tools") -> dict[str, Tool]:
    """``{name: Tool}`` in order, each schema from ``transformers.utils.get_json_schema`` (type hints and a
    Google-style docstring). ConfigError for a tool that cannot be imported or has no schema (quoted)."""
    from transformers.utils import get_json_schema

    tools: dict[str, Tool] = {}
    for i, spec in enumerate(specs):
        fn = load_callable(spec, f"{key}[{i}]")
        try:
            schema = get_json_schema(fn)
        except Exception as err:  # noqa: BLE001 - transformers' DocstringParsingException/TypeHintParsingException
            raise ConfigError(f"{key}[{i}]={spec!r}: no JSON schema from its signature and docstring ({err}); give "
                              "every argument a type hint and the docstring a description and an Args: section.")
        schema["function"].pop("return", None)  # chat templates render only name, description and parameters
        tools[schema["function"]["name"]] = Tool(spec, fn, schema)
    return tools
