"""A reward function written for verl, used by easyrl unchanged (docs/migrating.md, ``easyrl/rewards/styles.py``).

``worker.reward.reward_function: examples/reward_function/verl_style.py:compute_score``. easyrl sees the parameter
``solution_str`` and calls it as verl's reward manager does: once per response, with keywords ``data_source`` (the
dataset's ``data_source`` column), ``solution_str`` (the response), ``ground_truth`` (``reward_model["ground_truth"]``
when the dataset has verl's ``reward_model`` column, else ``data.answer_key``'s column) and ``extra_info`` (the
``extra_info`` column), plus ``worker.reward.reward_function_kwargs``. The returned ``score`` is the reward
(``reward/overall``); the other numbers are logged as ``reward/<name>``.
"""

from mathruler.grader import extract_boxed_content, grade_answer


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  format_score: float = 0.0) -> dict[str, float]:
    """1.0 when the last ``\\boxed{}`` of ``solution_str`` grades equal to ``ground_truth``; ``format_score`` when
    the response has a box with a wrong answer; 0.0 without a box (verl's gsm8k scheme)."""
    if "\\boxed{" not in solution_str:
        return {"score": 0.0, "acc": 0.0}
    correct = grade_answer(extract_boxed_content(solution_str), str(ground_truth))
    return {"score": 1.0 if correct else format_score, "acc": float(correct)}
