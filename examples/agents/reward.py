"""Reward for the calculator agent (examples/qwen3_4b_math12k_calculator_agent.sh, docs/agents.md): the final
answer is the last ``\\boxed{}`` of the LAST assistant turn (``messages``, which a multi-turn rollout passes to the
reward function beside ``response``, the whole text after the prompt, tool turns included), graded by mathruler as
examples/reward_function/math.py does. ``tool_calls`` and ``tool_errors`` are only logged (``reward/tool_calls``)."""

from mathruler.grader import extract_boxed_content, grade_answer


def compute_score(reward_inputs: list[dict]) -> list[dict[str, float]]:
    """One ``{"overall", "accuracy", "tool_calls", "tool_errors"}`` per input; ``overall`` = accuracy (0 or 1)."""
    scores = []
    for item in reward_inputs:
        turns = [m["content"] for m in item.get("messages", []) if m["role"] == "assistant"]
        final = turns[-1] if turns else item["response"]
        correct = "\\boxed{" in final and grade_answer(extract_boxed_content(final), item["ground_truth"])
        calls = item.get("tool_calls", [])
        scores.append({"overall": float(correct), "accuracy": float(correct), "tool_calls": float(len(calls)),
                       "tool_errors": float(sum(c.get("status") != "ok" for c in calls))})
    return scores
