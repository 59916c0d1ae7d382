"""A reward function that raises or hangs on one sample: reported with the step, the sample's index and its
response, then handled by ``worker.reward.on_error`` (raise | zero) with a per-call time limit."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from easyrl.rewards.function import RewardFunction
from easyrl.rewards.guard import GuardedReward, RewardSampleError

FAULTY_FILE = str(Path(__file__).parent / "reward_functions" / "faulty.py")


def _fn(reward_type: str) -> RewardFunction:
    name = "compute_score" if reward_type == "batch" else "score_one"
    return RewardFunction(f"{FAULTY_FILE}:{name}", reward_type=reward_type)


def _inputs(*responses: str) -> list[dict]:
    return [{"response": r, "response_length": len(r), "ground_truth": "1"} for r in responses]


@pytest.mark.parametrize("reward_type", ["batch", "sequential"])
def test_raise_names_step_sample_and_response(reward_type):
    guard = GuardedReward(_fn(reward_type), on_error="raise", timeout_s=None)
    with pytest.raises(RewardSampleError, match=r"step 7, sample 1: ValueError: cannot parse the answer; response: "
                                          r"'it went boom'"):
        guard(_inputs("fine", "it went boom", "ok"), step=7)


@pytest.mark.parametrize("reward_type", ["batch", "sequential"])
def test_zero_scores_failing_samples_and_counts_them(reward_type, caplog):
    guard = GuardedReward(_fn(reward_type), on_error="zero", timeout_s=None)
    with caplog.at_level(logging.WARNING, logger="easyrl.reward"):
        scores, failures = guard(_inputs("fine", "boom", "ok!", "boom again"), step=3)
    assert scores == {"overall": [4.0, 0.0, 3.0, 0.0], "format": [1.0, 0.0, 1.0, 0.0]}
    assert [f.index for f in failures] == [1, 3]
    assert "step 3, sample 3" in caplog.text and "'boom again'" in caplog.text


def test_a_hanging_sample_times_out_and_the_helper_restarts():
    guard = GuardedReward(_fn("batch"), on_error="zero", timeout_s=2.0)
    try:
        assert guard(_inputs("warm up"), step=1) == ({"overall": [7.0], "format": [1.0]}, [])  # helper started
        start = time.perf_counter()
        scores, failures = guard(_inputs("a", "hang here", "bc"), step=2)
        elapsed = time.perf_counter() - start
        assert scores["overall"] == [1.0, 0.0, 2.0]
        assert [f.index for f in failures] == [1] and "timeout_s=2" in failures[0].error
        assert elapsed < 300  # two 2 s time limits and helper restarts (slow on a loaded 2-core machine), not the hang (an hour)
        assert guard(_inputs("xyz"), step=3) == ({"overall": [3.0], "format": [1.0]}, [])  # a fresh helper works
    finally:
        guard.close()


def test_timeout_with_raise_stops():
    guard = GuardedReward(_fn("sequential"), on_error="raise", timeout_s=2.0)
    try:
        with pytest.raises(RewardSampleError, match="step 4, sample 0: no result within"):
            guard(_inputs("hang"), step=4)
    finally:
        guard.close()


def test_the_reward_actor_scores_through_the_guard():
    from easyrl.rewards.remote import RewardScorer

    scorer = RewardScorer()  # what the trainer runs as a Ray actor, overlapped with the log-prob passes
    scores, failures = scorer.score_guarded(f"{FAULTY_FILE}:compute_score", {}, "batch", _inputs("ab", "boom"),
                                            "zero", None, 5)
    assert scores["overall"] == [2.0, 0.0] and [f.index for f in failures] == [1]
    with pytest.raises(RewardSampleError, match="step 6, sample 1"):
        scorer.score_guarded(f"{FAULTY_FILE}:compute_score", {}, "batch", _inputs("ab", "boom"), "raise", None, 6)


@pytest.mark.parametrize("on_error", ["raise", "zero"])
def test_an_exception_other_than_value_error_is_guarded_in_process(on_error):
    """Every other test reward raises ValueError; a guard narrowed to ``except ValueError`` would let this
    ZeroDivisionError through as a traceback."""
    guard = GuardedReward(_fn("batch"), on_error=on_error, timeout_s=None)
    if on_error == "raise":
        with pytest.raises(RewardSampleError, match=r"step 2, sample 1: ZeroDivisionError: division by zero"):
            guard(_inputs("ab", "divide me"), step=2)
    else:
        scores, failures = guard(_inputs("ab", "divide me"), step=2)
        assert scores["overall"] == [2.0, 0.0] and [f.index for f in failures] == [1]
        assert failures[0].error.startswith("ZeroDivisionError")


def test_a_helper_process_that_dies_is_reported_and_replaced():
    """A reward function that ends its own process (``os._exit``; a segfault or the OOM killer look the same): the call
    reports the sample as failed, naming the death and the exit code, and a new helper scores the next call."""
    guard = GuardedReward(_fn("sequential"), on_error="zero", timeout_s=30.0)
    try:
        assert guard(_inputs("warm"), step=1)[1] == []
        first = guard._helper.process.pid
        scores, failures = guard(_inputs("ab", "exit now", "abc"), step=2)
        assert scores["overall"] == [2.0, 0.0, 3.0]
        assert [f.index for f in failures] == [1]
        assert "died (exit code 3)" in failures[0].error
        assert guard(_inputs("xyz"), step=3) == ({"overall": [3.0], "format": [1.0]}, [])
        assert guard._helper.process.pid != first  # replaced
        with pytest.raises(RewardSampleError, match=r"step 4, sample 0: the reward process died \(exit code 3\)"):
            GuardedReward(_fn("sequential"), on_error="raise", timeout_s=30.0)(_inputs("exit now"), step=4)
    finally:
        guard.close()
