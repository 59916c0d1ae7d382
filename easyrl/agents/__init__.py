"""Agents: what a multi-turn rollout needs beside the engine (docs/agents.md).

One concept per module: ``specs`` (importing ``path/to/file.py:function``), ``tools`` (tools and their JSON
schemas), ``parsers`` (tool calls in the model's text), ``executor`` (running tool calls in a process pool with a
per-call timeout), ``environment`` (the ``fn(messages)`` hook), ``chat`` (the token ids of a tool/environment turn)
and ``trajectory`` (the turn loop's bookkeeping: token ids, the response mask, the conversation). The rollout that
drives them on the workers' engines is ``easyrl.trainer.multi_turn.MultiTurnRollout``.
"""
