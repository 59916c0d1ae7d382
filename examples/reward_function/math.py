"""Math reward for `\\boxed{}` answers after a `<think> </think>` block (e.g. Geometry3K).

Use with ``worker.reward.reward_function: examples/reward_function/math.py:compute_score`` and
``worker.reward.reward_type: batch``. Answers are compared with ``mathruler.grader.grade_answer`` (normalised string
match, then a sympy check), which also accepts LaTeX such as ``\\frac{\\sqrt{2}}{10}``.
"""

import re

from mathruler.grader import extract_boxed_content, grade_answer

# `<think>...</think>`, then text holding a `\boxed{...}` with something other than whitespace inside.
THINK_THEN_BOXED = re.compile(r"\s*<think>.*</think>.*\\boxed\{\s*[^\s}].*", re.DOTALL)


def format_score(response: str) -> float:
    """1.0 if ``response`` is a think block followed by a non-empty ``\\boxed{}``, else 0.0."""
    return 1.0 if THINK_THEN_BOXED.fullmatch(response) else 0.0


def accuracy_score(response: str, ground_truth: str) -> float:
    """1.0 if the last ``\\boxed{}`` of ``response`` grades equal to ``ground_truth``, else 0.0 (also without a box)."""
    if "\\boxed{" not in response:
        return 0.0
    return 1.0 if grade_answer(extract_boxed_content(response), ground_truth) else 0.0


def compute_score(reward_inputs: list[dict], format_weight: float = 0.1) -> list[dict[str, float]]:
    """Batch reward: one ``{"overall", "format", "accuracy"}`` dict per input.

    ``overall = (1 - format_weight) * accuracy + format_weight * format``, each term 0 or 1.

    Args:
        reward_inputs: dicts with ``response`` (str) and ``ground_truth`` (str).
        format_weight: weight of the format term, in [0, 1].

    Raises:
        ValueError: ``format_weight`` outside [0, 1].
    """
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"format_weight must be in [0, 1], got {format_weight} (worker.reward.reward_function_kwargs)")
    scores = []
    for reward_input in reward_inputs:
        response = reward_input["response"]
        fmt = format_score(response)
        acc = accuracy_score(response, reward_input["ground_truth"])
        scores.append({"overall": (1.0 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc})
    return scores
