"""Tool calls in a process pool with a per-call timeout: errors, hangs and garbage are answered and counted, never
raised (``easyrl.agents.executor``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from easyrl.agents.executor import ToolExecutor

TOOLS = Path(__file__).parent / "agent_tools" / "tools.py"


@pytest.fixture(scope="module")
def executor():
    names = ("add", "echo", "flaky", "slow", "garbage")
    pool = ToolExecutor({name: f"{TOOLS}:{name}" for name in names}, timeout_s=5.0, workers=2, max_chars=40)
    yield pool
    pool.close()


def test_results_errors_timeouts_and_garbage_come_back_in_order(executor, monkeypatch):
    monkeypatch.delenv("EASYRL_TEST_TOOL_DIR", raising=False)  # flaky raises and slow hangs on every call
    calls = [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "flaky", "arguments": {"text": "x"}},
             {"name": "slow", "arguments": {"text": "x"}}, {"name": "garbage", "arguments": {}},
             {"name": "nope", "arguments": {}}, {"error": "the tool call is not valid JSON"},
             {"name": "add", "arguments": {"a": 1}}, {"name": "echo", "arguments": {"text": "y" * 100}}]
    futures = executor.submit(calls)  # returns once the pool has started; the calls run while the caller goes on
    start = time.monotonic()
    assert not futures[2].done
    executor.wait(futures, float("inf"))  # back at the first answer, long before the hang's timeout
    assert time.monotonic() - start < 4.5 and not futures[2].done and any(f.done for f in futures[:2])
    while not all(f.done for f in futures):
        executor.wait(futures, float("inf"))
    results = [f.result for f in futures]
    assert time.monotonic() - start < 30
    assert [r.status for r in results] == ["ok", "error", "timeout", "ok", "error", "error", "error", "ok"]
    assert results[0].content == "5"
    assert "RuntimeError: flaky tool failed" in results[1].content
    assert "no answer within 5 s" in results[2].content
    assert results[3].content.startswith("<object object")
    assert "unknown tool 'nope'" in results[4].content and "not valid JSON" in results[5].content
    assert "TypeError" in results[6].content
    assert len(results[7].content) == 40  # max_tool_response_length
    # the pool was replaced after the hang: calls still run
    assert [r.content for r in executor.run([{"name": "add", "arguments": {"a": 1, "b": 1}}])] == ["2"]
    pending = executor.submit([{"name": "slow", "arguments": {"text": "x"}}])
    executor.close()  # the rollout ends (or fails) with a call still running: it is answered, never left open
    assert pending[0].done and pending[0].result.status == "error"


def test_calls_queued_behind_a_hang_run_in_a_fresh_pool(monkeypatch):
    monkeypatch.delenv("EASYRL_TEST_TOOL_DIR", raising=False)
    pool = ToolExecutor({name: f"{TOOLS}:{name}" for name in ("slow", "echo")}, timeout_s=1.0, workers=1)
    try:  # the only process hangs: once it is stopped, the queued call runs in a new pool
        results = pool.run([{"name": "slow", "arguments": {"text": "x"}}, {"name": "echo", "arguments": {"text": "y"}}])
    finally:
        pool.close()
    assert [(r.status, r.content) for r in results][1] == ("ok", "echo: y") and results[0].status == "timeout"
