"""An OpenAI-compatible endpoint over easyrl's rollout engines, for agents written against an API (docs/agents.md,
"Bring your agent"): vLLM's own serving layer renders and parses, easyrl samples, every request is recorded
token-exact and a session's requests assemble into trajectory segments (``easyrl.agents.segments``, pure Python).

``engine``: the ``EngineClient`` over a ``sample`` callable; ``server``: ``AgentEndpoint`` and its sessions;
``stream``: the ``sample`` over ``RequestStream``. The package itself imports nothing (``server`` imports vLLM's
serving layer): import from the module that holds a name.
"""
