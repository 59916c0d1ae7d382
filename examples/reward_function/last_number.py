"""Reward for short numeric answers in free text: the last integer of the response must equal the ground truth.

The GSM8K convention (the final number is the answer), exact match on integers. A response without any integer
(an empty answer) scores 0. Use with ``worker.reward.reward_function: examples/reward_function/last_number.py:
compute_score`` (``reward_type: batch``), e.g. for the single-digit addition of ``make demo-learn``.
"""

import re

INTEGER = re.compile(r"-?\d+")


def last_integer(response: str) -> str | None:
    """The last integer written in ``response`` (digits with an optional minus sign), or None if there is none."""
    found = INTEGER.findall(response)
    return found[-1] if found else None


def compute_score(reward_inputs: list[dict]) -> list[dict[str, float]]:
    """Batch reward: one ``{"overall", "accuracy", "answered"}`` dict per input.

    ``accuracy`` is 1.0 if ``last_integer(response)`` equals ``int(ground_truth)``, else 0.0; ``answered`` is 1.0 if
    the response holds an integer at all; ``overall = accuracy``.

    Args:
        reward_inputs: dicts with ``response`` (str) and ``ground_truth`` (str holding an integer).

    Raises:
        ValueError: a ground truth that is not an integer (the message gives its index).
    """
    scores = []
    for i, reward_input in enumerate(reward_inputs):
        try:
            truth = int(str(reward_input["ground_truth"]).strip())
        except ValueError:
            truth = reward_input["ground_truth"]
            raise ValueError(f"reward input {i}: ground_truth {truth!r} is not an integer") from None
        answer = last_integer(reward_input["response"])
        accuracy = 1.0 if answer is not None and int(answer) == truth else 0.0
        scores.append({"overall": accuracy, "accuracy": accuracy, "answered": float(answer is not None)})
    return scores
