"""A reward function that may raise or hang on a sample without losing the run (``worker.reward.timeout_s``,
``worker.reward.on_error``: ``raise`` names the step, sample and response; ``zero`` scores failures 0 and counts them).
With a time limit the function runs in a ``spawn`` helper process, restarted after a timeout or crash. A failed
``batch`` call is retried sample by sample to find the failing ones.
"""

from __future__ import annotations

import logging
import multiprocessing
import traceback
from dataclasses import dataclass
from typing import Any, Optional

from easyrl.errors import RewardError
from easyrl.rewards.function import RewardFunction

logger = logging.getLogger("easyrl.reward")
_SHOWN_CHARS = 500  # of a failing response in messages
_START_TIMEOUT_S = 600


class RewardSampleError(RewardError):
    """The reward function failed on a sample and ``worker.reward.on_error`` is ``raise``."""


@dataclass
class RewardFailure:
    """One sample the function could not score; ``index`` None: the batch call failed, every sample alone succeeded."""

    index: Optional[int]
    response: Optional[str]
    error: str

    def describe(self, step: int) -> str:
        """A one-paragraph report naming the step, the sample and its response."""
        if self.index is None:
            return f"step {step}: the batch call failed (every sample alone succeeded): {self.error}"
        shown = self.response if len(self.response) <= _SHOWN_CHARS else self.response[:_SHOWN_CHARS] + "..."
        return f"step {step}, sample {self.index}: {self.error}; response: {shown!r}"


def _serve(conn, spec: str, kwargs: dict, reward_type: str) -> None:
    """The helper process: score what arrives on ``conn`` until it closes."""
    try:
        fn = RewardFunction(spec, kwargs, reward_type)
    except Exception as err:  # noqa: BLE001 - reported by the trainer
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            inputs = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", fn(inputs)))
        except Exception as err:  # noqa: BLE001 - any failure of user code is reported to the trainer
            conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"))


class _Helper:
    """The helper process and its pipe."""

    def __init__(self, reward_fn: RewardFunction):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, reward_fn.spec, reward_fn.kwargs, reward_fn.reward_type),
                                   daemon=True, name="easyrl-reward")
        self.process.start()
        child.close()
        # the time limit is per call: the helper's start (imports, loading the file) is not counted in it
        if not self.conn.poll(_START_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"the reward helper process did not start within {_START_TIMEOUT_S} s")
        status, value = self.conn.recv()
        if status != "ready":
            self.kill()
            raise RuntimeError(f"the reward helper process could not load {reward_fn.spec}: {value}")

    def call(self, inputs: list[dict[str, Any]], timeout_s: float) -> tuple[str, Any]:
        """``("ok", scores)``, or ``("error" | "timeout" | "crash", text)``."""
        try:
            self.conn.send(inputs)
            if not self.conn.poll(timeout_s):
                return "timeout", f"no result within worker.reward.timeout_s={timeout_s:g} s"
            return self.conn.recv()
        except (EOFError, OSError):  # the pipe closed under us: the process is gone
            self.process.join(5)
            return "crash", (f"the reward process died (exit code {self.process.exitcode}) while scoring; a new one "
                             "is started for the next call")

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


class GuardedReward:
    """``GuardedReward(reward_fn, on_error, timeout_s)(inputs, step) -> (scores, failures)``; a plain callable (not a
    ``RewardFunction``) is scored as ``batch`` in-process, without ``timeout_s`` (seconds per call, None: no limit).
    ValueError for an unknown ``on_error``."""

    def __init__(self, reward_fn: RewardFunction, on_error: str = "raise", timeout_s: Optional[float] = None):
        if on_error not in ("raise", "zero"):
            raise ValueError(f"worker.reward.on_error must be raise or zero, got {on_error!r}")
        self.reward_fn = reward_fn
        self.on_error = on_error
        self.is_spec = isinstance(reward_fn, RewardFunction)
        self.reward_type = reward_fn.reward_type if self.is_spec else "batch"
        self.where = reward_fn.where if self.is_spec else f"reward function {reward_fn!r}"
        self.timeout_s = timeout_s if self.is_spec else None
        self._helper: Optional[_Helper] = None

    def _call(self, inputs: list[dict[str, Any]]) -> tuple[bool, Any]:
        """``(True, scores)`` or ``(False, error text)`` for one call of the function."""
        if self.timeout_s is None:
            try:
                return True, self.reward_fn(inputs)
            except Exception as err:  # noqa: BLE001 - any failure of user code is handled by the policy
                return False, f"{type(err).__name__}: {err}"
        if self._helper is None or not self._helper.process.is_alive():
            self._helper = _Helper(self.reward_fn)
        status, value = self._helper.call(inputs, self.timeout_s)
        if status in ("timeout", "crash"):
            self._helper.kill()
            self._helper = None
        return status == "ok", value

    def __call__(self, inputs: list[dict[str, Any]], step: int) -> tuple[dict[str, list[float]], list[RewardFailure]]:
        """``(scores, failures)``, failed samples scored 0; RewardSampleError with ``on_error: raise``."""
        if self.reward_type == "batch":
            ok, value = self._call(inputs)
            if ok:
                return value, []
            batch_error = value
        rows: list[Optional[dict[str, float]]] = []
        failures: list[RewardFailure] = []
        for index, sample in enumerate(inputs):
            ok, value = self._call([sample])
            rows.append({name: values[0] for name, values in value.items()} if ok else None)
            if not ok:
                failures.append(RewardFailure(index, sample.get("response"), value))
                if self.on_error == "raise":
                    break
        if self.reward_type == "batch" and not failures:
            failures.append(RewardFailure(None, None, batch_error))
        for failure in failures:
            logger.warning("reward function failed at %s", failure.describe(step))
        if failures and self.on_error == "raise":
            raise RewardSampleError(
                f"{self.where} failed at {failures[0].describe(step)}. Fix the function, or set "
                f"worker.reward.on_error=zero to score failing samples 0 and go on."
            )
        names = next((list(row) for row in rows if row is not None), ["overall"])
        scores = {name: [0.0 if row is None else row[name] for row in rows] for name in names}
        return scores, failures

    def close(self) -> None:
        """Stop the helper process, if any."""
        if self._helper is not None:
            self._helper.kill()
            self._helper = None
