"""The environment hook (``worker.rollout.multi_turn.environment: path/to/file.py:function``): after an assistant
turn without a tool call it is called with the conversation so far (a list of ``{"role", "content"}`` dicts, the
prompt's messages not included: ``[assistant, tool, ..., assistant]``) and returns the next user/environment
message (a string or a ``{"role", "content"}`` dict) or None when the episode is done."""

from __future__ import annotations

from typing import Any, Callable, Optional

from easyrl.agents.specs import load_callable

__all__ = ["load_environment", "next_message"]


def load_environment(spec: Optional[str]) -> Optional[Callable]:
    """The hook, or None without one. Raises ``ConfigError`` (``load_callable``)."""
    return None if spec is None else load_callable(spec, "worker.rollout.multi_turn.environment", "fn(messages)")


def next_message(env: Callable, messages: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The environment's next message as a dict (``role`` ``user`` unless it says otherwise), or None (done).

    Raises:
        TypeError: the hook returned something else than None, a string or a dict with ``content`` (naming it).
    """
    out = env([dict(m) for m in messages])
    if out is None:
        return None
    if isinstance(out, str):
        return {"role": "user", "content": out}
    if isinstance(out, dict) and "content" in out:
        return {"role": out.get("role", "user"), "content": out["content"]}
    raise TypeError(f"the environment {getattr(env, '__name__', env)!r} returned a {type(out).__name__}; expected "
                    "None (done), a string or a {'role', 'content'} dict")
