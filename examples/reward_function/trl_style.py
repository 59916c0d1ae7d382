"""A reward function written for TRL's GRPOTrainer, used by easyrl unchanged (docs/migrating.md,
``easyrl/rewards/styles.py``).

``worker.reward.reward_function: examples/reward_function/trl_style.py:accuracy_reward`` with ``data.answer_key:
solution``. easyrl sees the first parameter ``completions`` and calls it as TRL does: once per batch, with
``prompts=`` (the ``data.prompt_key`` column), ``completions=`` (strings, or ``[{"role": "assistant", "content":
...}]`` when the prompt is a conversation) and every other dataset column as a keyword holding one value per
completion. It returns one float per completion (``None``: not applicable, scored 0 as in TRL).
"""

from mathruler.grader import extract_boxed_content, grade_answer


def accuracy_reward(completions: list, solution: list[str], **kwargs) -> list[float | None]:
    """1.0 when a completion's last ``\\boxed{}`` grades equal to its ``solution``, else 0.0; None without a
    solution."""
    rewards = []
    for completion, answer in zip(completions, solution):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        if not answer:
            rewards.append(None)
        elif "\\boxed{" not in text:
            rewards.append(0.0)
        else:
            rewards.append(1.0 if grade_answer(extract_boxed_content(text), str(answer)) else 0.0)
    return rewards
