"""A tool-call parser plug-in for the tests (``worker.rollout.multi_turn.format=tests/agent_tools/parser.py:...``):
a random tiny model writes no tool calls, so every assistant turn is read as calls of the test tools."""


def every_turn(text: str) -> list[dict]:
    """Each assistant turn calls ``echo`` (with the turn's first characters), ``flaky`` and ``slow``."""
    return [{"name": "echo", "arguments": {"text": text[:8]}},
            {"name": "flaky", "arguments": {"text": "x"}},
            {"name": "slow", "arguments": {"text": "x"}}]


def echo_only(text: str) -> list[dict]:
    """Each assistant turn calls ``echo``."""
    return [{"name": "echo", "arguments": {"text": text[:8]}}]


def lagging_only(text: str) -> list[dict]:
    """Each assistant turn calls ``lagging`` (``echo`` whose first call sleeps)."""
    return [{"name": "lagging", "arguments": {"text": text[:8]}}]


def paint_every_turn(text: str) -> list[dict]:
    """Each assistant turn calls ``paint`` (tests/agent_tools/image_tools.py) with the turn's first characters."""
    return [{"name": "paint", "arguments": {"text": text[:8]}}]


def varied(text: str) -> list[dict]:
    """A turn count that varies by trajectory: a turn calls ``nap`` unless the crc32 of its text is 0 mod 3 (then
    the trajectory answers and ends), so trajectories run 1 to ``max_assistant_turns`` turns (bench/multi_turn_speed.py,
    the varied workload)."""
    import zlib

    return [] if zlib.crc32(text.encode()) % 3 == 0 else [{"name": "nap", "arguments": {"text": text[:8]}}]
