"""Reward functions: user-supplied scorers loaded by path, and token-level placement of their scores."""

from easyrl.rewards.function import RewardFunction, load_function, scores_to_token_rewards

__all__ = ["RewardFunction", "load_function", "scores_to_token_rewards"]
