"""A test reward for multi-turn rollouts: requires the conversation and the tool calls among the inputs (raises
without them), and scores the share of ASCII letters in the last assistant turn (varies between random responses,
so GRPO advantages are not all zero)."""


def compute_score(reward_inputs):
    scores = []
    for item in reward_inputs:
        messages, calls = item["messages"], item["tool_calls"]  # KeyError without them: the run fails
        last = [m["content"] for m in messages if m["role"] == "assistant"][-1]
        letters = sum(ch.isascii() and ch.isalpha() for ch in last)
        scores.append({"overall": letters / max(len(last), 1), "tool_calls": float(len(calls))})
    return scores
