"""Agents: what a multi-turn rollout (``easyrl.trainer.multi_turn``) needs beside the engine (docs/agents.md)."""
