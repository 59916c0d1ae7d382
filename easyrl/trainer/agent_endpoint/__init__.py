"""An OpenAI-compatible endpoint over easyrl's rollout engines, for agents written against an API (docs/agents.md,
"Bring your agent"): vLLM's own serving layer renders and parses, easyrl samples, every request is recorded
token-exact and a session's requests assemble into trajectory segments (``easyrl.agents.segments``, pure Python).

``engine``: the ``EngineClient`` over a ``sample`` callable; ``server``: ``AgentEndpoint`` and its sessions (import
vLLM: loaded on first use of those names); ``stream``: the ``sample`` over ``RequestStream``.
"""

from easyrl.agents.segments import RequestRecord, Segment, assemble_segments

__all__ = ["AgentEndpoint", "RequestRecord", "Segment", "Session", "assemble_segments"]


def __getattr__(name: str):
    if name in ("AgentEndpoint", "Session"):
        from easyrl.trainer.agent_endpoint import server

        return getattr(server, name)
    raise AttributeError(name)
