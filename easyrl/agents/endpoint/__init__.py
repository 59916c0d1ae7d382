"""An OpenAI-compatible endpoint over easyrl's rollout engines, for agents written against an API (docs/agents.md,
"Bring your agent"): vLLM's own serving layer renders and parses, easyrl samples, every request is recorded
token-exact and a session's requests assemble into trajectory segments.

``records`` is pure Python; ``server`` and ``engine`` import vLLM when an endpoint starts.
"""

from easyrl.agents.endpoint.records import RequestRecord, Segment, assemble_segments

__all__ = ["AgentEndpoint", "RequestRecord", "Segment", "Session", "assemble_segments"]


def __getattr__(name: str):
    if name in ("AgentEndpoint", "Session"):
        from easyrl.agents.endpoint import server

        return getattr(server, name)
    raise AttributeError(name)
