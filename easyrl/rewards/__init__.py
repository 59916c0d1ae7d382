"""Reward functions: user-supplied scorers loaded by path (``function``), and token-level placement of their scores."""
