"""The token ids of a tool or environment turn, appended after the assistant's generated tokens (which are never
re-tokenized).

The chat template renders a conversation; the turn's text is what rendering ``[user, assistant, *new]`` (with the
generation prompt: the next assistant header) adds after the assistant's end-of-turn token in rendering
``[user, assistant]``. The generated ids end with that token (the engine stopped on it), so the delta starts right
after it: for Qwen's ChatML, ``"\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n
<|im_start|>assistant\\n"``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["turn_ids"]

_BASE = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]


def turn_ids(tokenizer: Any, messages: list[dict[str, Any]], end_text: str) -> list[int]:
    """Token ids of ``messages`` (tool/user turns following an assistant turn) up to the next assistant header.

    Args:
        tokenizer: a tokenizer (or processor) with a chat template.
        messages: the new turns, e.g. ``[{"role": "tool", "content": "42"}]``.
        end_text: the text of the token the assistant turn ended with (e.g. ``<|im_end|>``), or ``""`` for a turn
            cut before its end (the new turns then start right after it, e.g. ``"<|im_start|>tool\n..."``).

    Raises:
        ValueError: the template renders the earlier turns differently once the new ones follow (no delta exists).
    """
    before = tokenizer.apply_chat_template(_BASE, tokenize=False)
    after = tokenizer.apply_chat_template(_BASE + list(messages), tokenize=False, add_generation_prompt=True)
    cut = before.rfind(end_text)
    cut = cut + len(end_text) if end_text and cut >= 0 else len(before)
    if after[:cut] != before[:cut]:
        raise ValueError("the chat template renders the conversation differently once a tool/user turn follows; "
                         "easyrl cannot append the turn without re-tokenizing the assistant's tokens")
    return tokenizer.encode(after[cut:], add_special_tokens=False)
