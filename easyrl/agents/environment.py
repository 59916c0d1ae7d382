"""The environment hook (``worker.rollout.multi_turn.environment``): after an assistant turn without a tool call,
``fn(messages)`` gets the conversation after the prompt and returns the next message (a string or a
``{"role", "content"}`` dict) or None when the episode is done."""

from __future__ import annotations

from typing import Any, Callable, Optional

from easyrl.agents.specs import load_callable

__all__ = ["load_environment", "next_message"]


def load_environment(spec: Optional[str]) -> Optional[Callable]:
    """The hook, or None without one. Raises ``ConfigError`` (``load_callable``)."""
    return None if spec is None else load_callable(spec, "worker.rollout.multi_turn.environment", "fn(messages)")


def next_message(env: Callable, messages: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The next message (``role`` ``user`` by default) or None; TypeError naming the hook for another return value."""
    out = env([dict(m) for m in messages])
    if out is None:
        return None
    if isinstance(out, str):
        return {"role": "user", "content": out}
    if isinstance(out, dict) and "content" in out:
        return {"role": out.get("role", "user"), "content": out["content"]}
    raise TypeError(f"the environment {getattr(env, '__name__', env)!r} returned a {type(out).__name__}; expected "
                    "None (done), a string or a {'role', 'content'} dict")
