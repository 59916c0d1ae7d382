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
