"""Tool calls run in a pool of processes, each with a time limit; a call that raises, hangs or returns something
that is not text never ends the run: the model reads what happened as the tool's answer, and the rollout counts it.

The processes are started with ``spawn`` (no copy of the trainer's threads and Ray state) and import each tool file
once. Calls run in waves of ``workers``; a wave in which a call ran past ``timeout_s`` (a hang, or a process that
died) ends with the pool terminated (its processes killed) and a fresh pool for the next wave.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["ToolResult", "ToolExecutor", "render_result"]


@dataclass
class ToolResult:
    """What one call gave: ``content`` (the tool message's text), ``status`` (``ok``, ``error``, ``timeout``) and
    ``images`` (``PIL.Image`` each, for VL models: ``easyrl.agents.tool_images``)."""

    content: str
    status: str
    images: list = field(default_factory=list)


def _started(_: int) -> None:
    """A no-op run once per pool process when the pool starts (see ``ToolExecutor._ensure_pool``)."""


def render_result(value: Any) -> str:
    """A tool's return value as the tool message's text: strings as they are, JSON for what JSON can hold, else
    ``str``."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _run(spec: str, arguments: dict[str, Any]) -> tuple[str, str, list]:
    """In a pool process: call the tool; ``("ok", text, images)`` or ``("error", "ExcType: message", [])``."""
    from easyrl.agents.specs import load_callable
    from easyrl.agents.tool_images import split_images

    try:
        text, images = split_images(load_callable(spec, "tool")(**arguments))
        return "ok", render_result(text), images
    except Exception as err:  # noqa: BLE001 - the tool's failure is the model's to read
        return "error", f"{type(err).__name__}: {err}", []


class ToolExecutor:
    """Runs tool calls in ``workers`` processes, ``timeout_s`` seconds each at most.

    Args:
        specs: tool name -> ``path/to/file.py:function`` (``easyrl.agents.tools.Tool.spec``).
        timeout_s: seconds one call may take (``worker.rollout.multi_turn.tool_timeout_s``).
        workers: processes (``num_tool_workers``).
        max_chars: characters of a tool's answer kept (``max_tool_response_length``).
    """

    def __init__(self, specs: dict[str, str], timeout_s: float, workers: int = 4, max_chars: int = 256):
        self.specs = specs
        self.timeout_s = timeout_s
        self.workers = workers
        self.max_chars = max_chars
        self._pool: Optional[Any] = None

    def _ensure_pool(self):
        if self._pool is None:
            self._pool = multiprocessing.get_context("spawn").Pool(self.workers)
            # wait until every process has started (spawn re-imports easyrl: seconds on a loaded host), so the start
            # does not count against a call's timeout
            self._pool.map(_started, range(self.workers), chunksize=1)
        return self._pool

    def run(self, calls: list[dict[str, Any]]) -> list[ToolResult]:
        """One result per call, in order. A call is ``{"name", "arguments"}`` or a parser's ``{"error": why}``;
        an unknown tool name is an error (the known names are listed to the model)."""
        results: list[Optional[ToolResult]] = [None] * len(calls)
        todo = []
        for i, call in enumerate(calls):
            if "error" in call:
                results[i] = ToolResult(f"Error: {call['error']}", "error")
            elif call.get("name") not in self.specs:
                results[i] = ToolResult(f"Error: unknown tool {call.get('name')!r}; the tools are "
                                        f"{sorted(self.specs)}", "error")
            else:
                todo.append(i)
        for start in range(0, len(todo), self.workers):
            wave = todo[start:start + self.workers]
            pool = self._ensure_pool()
            pending = {i: pool.apply_async(_run, (self.specs[calls[i]["name"]], calls[i]["arguments"])) for i in wave}
            deadline = time.monotonic() + self.timeout_s
            hung = False
            for i, handle in pending.items():
                handle.wait(max(0.0, deadline - time.monotonic()))
                if not handle.ready():
                    results[i] = ToolResult(f"Error: the tool {calls[i]['name']!r} gave no answer within "
                                            f"{self.timeout_s:g} s and was stopped", "timeout")
                    hung = True
                    continue
                status, text, images = handle.get()
                results[i] = ToolResult(text if status == "ok" else f"Error: {text}", status, images)
            if hung:
                self.close()  # kills the hung process; the next wave gets a fresh pool
        # a tool's answer is cut to max_chars; easyrl's own error messages are kept whole
        return [ToolResult(r.content[:self.max_chars], r.status, r.images) if r.status == "ok" else r for r in results]

    def close(self) -> None:
        """Kill the pool's processes (a new pool starts on the next call)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
