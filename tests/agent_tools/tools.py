"""Tools for the agent tests (tests/test_agents_*.py, tests/test_e2e_multi_turn.py): one that works, one that
raises, one that hangs, one that returns something that is not JSON. ``flaky`` and ``slow`` misbehave only on their
first call in a folder given by ``EASYRL_TEST_TOOL_DIR`` (a marker file per tool), every call without it."""

import os
import time


def _first_call(name: str) -> bool:
    folder = os.environ.get("EASYRL_TEST_TOOL_DIR")
    if not folder:
        return True
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def echo(text: str) -> str:
    """Repeat a text.

    Args:
        text: what to repeat.
    """
    return f"echo: {text}"


def flaky(text: str) -> str:
    """A tool that raises (on its first call when EASYRL_TEST_TOOL_DIR is set).

    Args:
        text: anything.
    """
    if _first_call("flaky"):
        raise RuntimeError("flaky tool failed")
    return "flaky ok"


def slow(text: str) -> str:
    """A tool that hangs (on its first call when EASYRL_TEST_TOOL_DIR is set).

    Args:
        text: anything.
    """
    if _first_call("slow"):
        time.sleep(600)
    return "slow ok"


def garbage() -> object:
    """A tool that returns an object that JSON cannot hold."""
    return object()


def no_docstring(a: int) -> int:
    return a


def lagging(text: str) -> str:
    """``echo`` that sleeps ``EASYRL_TEST_TOOL_SLEEP_S`` seconds (default 2) on its first call in
    ``EASYRL_TEST_TOOL_DIR`` (bench/multi_turn_speed.py's slow-tool case: one call per rollout is slow).

    Args:
        text: what to repeat.
    """
    if _first_call("lagging"):
        time.sleep(float(os.environ.get("EASYRL_TEST_TOOL_SLEEP_S", "2")))
    return f"echo: {text}"


def nap(text: str) -> str:
    """``echo`` that sleeps 0 to 2 s, by the crc32 of ``text`` (a tool latency that varies by call:
    bench/multi_turn_speed.py, the varied workload).

    Args:
        text: what to repeat.
    """
    import zlib

    time.sleep(zlib.crc32(text.encode()) % 21 / 10)
    return f"echo: {text}"
