"""Tool calls in a ``spawn`` process pool, each with a time limit; a call that raises, hangs or returns non-text is
answered to the model as the tool's answer and counted, never ending the run. A call past ``timeout_s`` is answered
at once; its process stays busy until no other call runs, then the pool is terminated and the next call gets a new one.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["ToolResult", "ToolExecutor", "ToolFuture", "render_result"]

_POLL_S = 0.002  # seconds between looks at the running calls


@dataclass
class ToolResult:
    """What one call gave: ``content`` (the tool message's text), ``status`` (``ok``, ``error``, ``timeout``) and
    ``images`` (``PIL.Image`` each, for VL models: ``easyrl.agents.tool_images``)."""

    content: str
    status: str
    images: list = field(default_factory=list)


def _started(_: int) -> None:
    """A no-op each pool process runs once at start."""


def render_result(value: Any) -> str:
    """A tool's return value as text: a string as is, else JSON, else ``str``."""
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
    """Runs tool calls (``specs``: tool name -> ``path/to/file.py:function``) in ``workers`` processes
    (``num_tool_workers``), ``timeout_s`` seconds each at most (``tool_timeout_s``), keeping ``max_chars`` characters
    of an answer (``max_tool_response_length``)."""

    def __init__(self, specs: dict[str, str], timeout_s: float, workers: int = 4, max_chars: int = 256):
        self.specs = specs
        self.timeout_s = timeout_s
        self.workers = workers
        self.max_chars = max_chars
        self._pool: Optional[Any] = None
        self._queue: list[ToolFuture] = []
        self._running: dict[ToolFuture, tuple[Any, float]] = {}
        self._hung = 0

    def run(self, calls: list[dict[str, Any]]) -> list[ToolResult]:
        """One result per call, in order (``submit`` then ``wait`` until all are answered)."""
        futures = self.submit(calls)
        while not all(f.done for f in futures):
            self.wait(futures, float("inf"))
        return [f.result for f in futures]

    def submit(self, calls: list[dict[str, Any]]) -> list["ToolFuture"]:
        """One future per call (``{"name", "arguments"}`` or a parser's ``{"error": why}``), returned at once; errors
        and unknown tools are answered right away, the rest queue for ``workers`` processes."""
        futures = [ToolFuture(call) for call in calls]
        for future in futures:
            call = future.call
            if "error" in call:
                future.result = ToolResult(f"Error: {call['error']}", "error")
            elif call.get("name") not in self.specs:
                future.result = ToolResult(f"Error: unknown tool {call.get('name')!r}; the tools are "
                                           f"{sorted(self.specs)}", "error")
            else:
                self._queue.append(future)
        self._pump()
        return futures

    def wait(self, futures: list["ToolFuture"], until: float) -> None:
        """Return when one more of ``futures`` is answered, all are, or at ``until`` (``time.monotonic()``)."""
        before = sum(f.done for f in futures)
        self._pump()
        while not all(f.done for f in futures) and sum(f.done for f in futures) == before and time.monotonic() < until:
            time.sleep(_POLL_S)
            self._pump()

    def poll(self) -> None:
        """Collect the answers given so far (and start queued calls) without waiting."""
        self._pump()

    def _pump(self) -> None:
        """Collect answers and timeouts, retire a pool whose only busy processes hang, start queued calls."""
        now = time.monotonic()
        for future, (handle, deadline) in list(self._running.items()):
            if handle.ready():
                status, text, images = handle.get()
                result = ToolResult(text if status == "ok" else f"Error: {text}", status, images)
            elif now >= deadline:
                result = ToolResult(f"Error: the tool {future.call['name']!r} gave no answer within "
                                    f"{self.timeout_s:g} s and was stopped", "timeout")
                self._hung += 1  # its process stays busy until the pool is retired
            else:
                continue
            del self._running[future]
            # a tool's answer is cut to max_chars; easyrl's own error messages are kept whole
            future.result = (ToolResult(result.content[:self.max_chars], "ok", result.images) if result.status == "ok"
                             else result)
        if self._hung and not self._running:
            self._retire_pool()  # kills the hung processes; the queued calls get a fresh pool
        while self._queue and len(self._running) + self._hung < self.workers:
            future = self._queue.pop(0)
            if self._pool is None:
                self._pool = multiprocessing.get_context("spawn").Pool(self.workers)
                # wait until every process has started (spawn re-imports easyrl: seconds on a loaded host), so the
                # start does not count against a call's timeout
                self._pool.map(_started, range(self.workers), chunksize=1)
            handle = self._pool.apply_async(_run, (self.specs[future.call["name"]], future.call["arguments"]))
            self._running[future] = (handle, time.monotonic() + self.timeout_s)

    def _retire_pool(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        self._hung = 0

    def close(self) -> None:
        """Kill the pool's processes; calls still running or queued are answered with an error."""
        self._retire_pool()
        for future in [*self._running, *self._queue]:
            future.result = ToolResult("Error: the tool pool was closed before the call was answered", "error")
        self._running.clear()
        self._queue.clear()


@dataclass(eq=False)  # hashed by identity: a key of the running calls
class ToolFuture:
    """One submitted call: ``call`` and, once answered, ``result`` (a ``ToolResult``; None before)."""

    call: dict[str, Any]
    result: Optional[ToolResult] = None

    @property
    def done(self) -> bool:
        """Whether the call is answered."""
        return self.result is not None
