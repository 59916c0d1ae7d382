"""DAPO's math reward: +1 / -1 for a right / wrong ``\\boxed{}`` answer, plus the soft overlong punishment.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale": the rule-based outcome reward
(Sec. 2.4: 1 if the answer is equivalent to the ground truth, else -1) and the soft overlong punishment (Eq. 13)::

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

with ``L_max = max_response_length`` and ``L_cache = overlong_buffer_length``, scaled by ``overlong_penalty_factor``.
The paper extracts the answer from an "Answer:" line; here it is the last ``\\boxed{}`` (graded with mathruler).

Use with ``worker.reward.reward_function: examples/reward_function/dapo.py:compute_score``,
``worker.reward.reward_type: batch`` and ``worker.reward.reward_function_kwargs: {max_response_length: ...,
overlong_buffer_length: ..., overlong_penalty_factor: ...}``.
"""

from mathruler.grader import extract_boxed_content, grade_answer


def soft_overlong_punishment(response_length: int, max_response_length: int, overlong_buffer_length: int) -> float:
    """``R_length`` of DAPO Eq. 13 for a response of ``response_length`` tokens: 0, then linear down to -1."""
    expected_length = max_response_length - overlong_buffer_length
    if response_length <= expected_length:
        return 0.0
    if response_length <= max_response_length:
        return (expected_length - response_length) / overlong_buffer_length
    return -1.0


def compute_score(
    reward_inputs: list[dict],
    max_response_length: int,
    overlong_buffer_length: int,
    overlong_penalty_factor: float = 1.0,
) -> list[dict[str, float]]:
    """Batch reward: one dict per input with
    ``accuracy`` (0 / 1), ``accuracy_reward`` (+1 / -1), ``overlong`` (``overlong_penalty_factor * R_length``, <= 0)
    and ``overall = accuracy_reward + overlong``.

    Args:
        reward_inputs: dicts with ``response`` (str), ``response_length`` (int, tokens) and ``ground_truth`` (str).
        max_response_length: ``L_max`` in tokens (usually the rollout's max response length).
        overlong_buffer_length: ``L_cache`` in tokens, in ``(0, max_response_length]``.
        overlong_penalty_factor: scale of the length penalty (>= 0).

    Raises:
        ValueError: inconsistent lengths or a negative penalty factor.
    """
    if not 0 < overlong_buffer_length <= max_response_length:
        raise ValueError(
            f"need 0 < overlong_buffer_length <= max_response_length, got {overlong_buffer_length} and "
            f"{max_response_length} (worker.reward.reward_function_kwargs)"
        )
    if overlong_penalty_factor < 0:
        raise ValueError(f"overlong_penalty_factor must be >= 0, got {overlong_penalty_factor}")
    scores = []
    for reward_input in reward_inputs:
        response = reward_input["response"]
        correct = "\\boxed{" in response and grade_answer(extract_boxed_content(response), reward_input["ground_truth"])
        accuracy_reward = 1.0 if correct else -1.0
        overlong = overlong_penalty_factor * soft_overlong_punishment(
            reward_input["response_length"], max_response_length, overlong_buffer_length
        )
        scores.append(
            {
                "overall": accuracy_reward + overlong,
                "accuracy": 1.0 if correct else 0.0,
                "accuracy_reward": accuracy_reward,
                "overlong": overlong,
            }
        )
    return scores
