"""``worker.rollout.multi_turn``: multi-turn rollouts with tools and an environment (``easyrl.agents``,
docs/agents.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated, Optional

from annotated_types import Ge

from easyrl.config.fields import NON_NEGATIVE, POSITIVE, AllowInf, Note
from easyrl.errors import ConfigError

__all__ = ["MultiTurnConfig", "check_multi_turn", "BUILTIN_FORMATS"]

BUILTIN_FORMATS = ("hermes",)
"""Tool-call parsers shipped with easyrl (``easyrl.agents.parsers``)."""
TURNS = Optional[Annotated[int, Ge(1), Note("null: no limit")]]


@dataclass
class MultiTurnConfig:
    """Each trajectory alternates assistant turns and tool (or environment) turns until a final answer,
    ``max_assistant_turns`` or ``data.max_response_length`` tokens."""

    enable: bool = False
    """Use the multi-turn rollout (``easyrl.trainer.multi_turn.MultiTurnRollout``) instead of one response per
    prompt."""
    max_assistant_turns: TURNS = None
    """Assistant turns per trajectory at most (null: only the token budget limits them)."""
    max_user_turns: TURNS = None
    """Environment (user) turns per trajectory at most (null: no limit but the token budget)."""
    max_tool_response_length: Annotated[int, POSITIVE] = 256
    """Characters of one tool's answer kept (longer ones are cut)."""
    format: str = "hermes"
    """Tool-call parser: ``hermes`` (Qwen2.5/Qwen3/Qwen3-VL ``<tool_call>{json}</tool_call>``) or
    ``path/to/file.py:function`` taking the assistant text and returning a list of ``{"name", "arguments"}`` dicts."""
    tools: list[str] = field(default_factory=list)
    """``path/to/file.py:function`` per tool; the JSON schema comes from the signature and the Google-style
    docstring (``transformers.utils.get_json_schema``) and goes into the chat template as ``tools=``."""
    tool_timeout_s: Annotated[float, POSITIVE] = 30.0
    """Seconds one tool call may take; beyond, the call's process is killed and the model reads a timeout."""
    num_tool_workers: Annotated[int, POSITIVE] = 4
    """Processes that run tool calls in parallel."""
    max_turn_tokens: TURNS = None
    """Tokens one assistant turn may generate at most (null: the rest of ``data.max_response_length``); a turn cut
    by it is parsed for tool calls like any other."""
    environment: Optional[str] = None
    """``path/to/file.py:function``, called as ``fn(messages)`` after an assistant turn without a tool call:
    returns the next user/environment message (a string, or a ``{"role", "content"}`` dict) or None (done)."""
    patience: Annotated[float, AllowInf(), NON_NEGATIVE, Note("inf: every round waits for every tool call")] = 0.25
    """How long the driver waits for late tool calls before the next assistant round starts without them, in units
    of the last round's generation time (50 ms at least; ``easyrl.agents.scheduler``): waiting idles the engines, a
    round without the late ones costs them a later round. ``inf``: every round waits for its slowest tool call (the
    round barrier); 0: a round starts as soon as one trajectory is ready."""


def _check_spec(key: str, spec: str) -> None:
    """A ``path/to/file.py:function`` spec whose file exists."""
    if not isinstance(spec, str) or ":" not in spec or not spec.rsplit(":", 1)[1].isidentifier():
        raise ConfigError(f"{key}={spec!r} is not of the form path/to/file.py:function; write e.g. "
                          f"{key}=examples/agents/tools.py:calculator.")
    path = spec.rsplit(":", 1)[0]
    if not os.path.isfile(path):
        raise ConfigError(f"{key}={spec!r}: no file {path!r} (relative paths start at the working directory "
                          f"{os.getcwd()!r}).")


def check_multi_turn(config: MultiTurnConfig) -> None:
    """Values of ``worker.rollout.multi_turn`` when ``enable``. Raises ``ConfigError``: an unknown ``format``, a
    malformed or missing ``tools``/``format``/``environment`` file, a tool name twice, or neither tools nor an
    environment."""
    if not config.enable:
        return
    key = "worker.rollout.multi_turn"
    if config.format not in BUILTIN_FORMATS:
        if ":" not in config.format:
            raise ConfigError(f"{key}.format={config.format!r} is not one of: {', '.join(BUILTIN_FORMATS)}, "
                              "nor a parser path/to/file.py:function.")
        _check_spec(f"{key}.format", config.format)
    for i, spec in enumerate(config.tools):
        _check_spec(f"{key}.tools[{i}]", spec)
    names = [spec.rsplit(":", 1)[1] for spec in config.tools]
    if len(set(names)) != len(names):
        raise ConfigError(f"{key}.tools names the function(s) {sorted({n for n in names if names.count(n) > 1})} "
                          "more than once: every tool needs its own function name.")
    if config.environment is not None:
        _check_spec(f"{key}.environment", config.environment)
    if not config.tools and config.environment is None:
        raise ConfigError(f"{key}.enable=true with neither {key}.tools nor {key}.environment: give at least one "
                          f"tool (path/to/file.py:function) or an environment, or set {key}.enable=false.")
