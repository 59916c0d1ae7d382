"""The token ids of a tool or environment turn, appended after the assistant's generated tokens (never
re-tokenized): what rendering ``[user, assistant, *new]`` with the generation prompt adds after the assistant's
end-of-turn token in rendering ``[user, assistant]``."""

from __future__ import annotations

from typing import Any

__all__ = ["turn_ids"]

_BASE = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]


def turn_ids(tokenizer: Any, messages: list[dict[str, Any]], end_text: str) -> list[int]:
    """Token ids of ``messages`` (e.g. ``[{"role": "tool", "content": "42"}]``) up to the next assistant header;
    ``end_text`` is the assistant turn's end token (``<|im_end|>``), ``""`` for a cut turn. ValueError when the
    template renders the earlier turns differently once the new ones follow."""
    before = tokenizer.apply_chat_template(_BASE, tokenize=False)
    after = tokenizer.apply_chat_template(_BASE + list(messages), tokenize=False, add_generation_prompt=True)
    cut = before.rfind(end_text)
    cut = cut + len(end_text) if end_text and cut >= 0 else len(before)
    if after[:cut] != before[:cut]:
        raise ValueError("the chat template renders the conversation differently once a tool/user turn follows; "
                         "easyrl cannot append the turn without re-tokenizing the assistant's tokens")
    return tokenizer.encode(after[cut:], add_special_tokens=False)
