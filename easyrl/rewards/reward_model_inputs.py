"""A reward model's inputs: each (prompt column, decoded response) rendered as a user/assistant chat by the reward
model's own chat template and encoded by its own tokenizer without adding special tokens (as
``apply_chat_template(..., tokenize=True)`` does)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

__all__ = ["RewardModelInputs", "encode_conversations", "load_tokenizer", "padding_id"]


def load_tokenizer(config: Any) -> Any:
    """The reward model's tokenizer (``worker.reward.reward_model``: ``tokenizer_path``, else ``model_path``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.tokenizer_path or config.model_path,
                                         trust_remote_code=config.trust_remote_code)


def padding_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its eos id; ValueError without either."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the reward model's tokenizer has neither a pad nor an eos token to pad with")
    return int(pad_id)


@dataclass
class RewardModelInputs:
    """Right-padded inputs: ``input_ids``/``attention_mask`` ``(bsz, longest)`` int64, ``truncated`` (inputs that lost
    their first tokens to ``max_length``), ``texts`` (the templated texts)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    truncated: int
    texts: list[str]


def encode_conversations(tokenizer: Any, prompts: list[str], responses: list[str],
                         chat_template: Optional[str] = None, max_length: Optional[int] = None) -> RewardModelInputs:
    """Template and encode (prompt, response) pairs; ``chat_template`` replaces the tokenizer's; a longer input keeps
    its last ``max_length`` tokens (where a classifier reads its score). ValueError without a chat template or a
    pad/eos token."""
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("the reward model's tokenizer has no chat template: set worker.reward.reward_model."
                         "chat_template to the template it was trained with")
    pad_id = padding_id(tokenizer)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": r}],
                                           chat_template=chat_template, tokenize=False)
             for p, r in zip(prompts, responses)]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    truncated = 0
    if max_length is not None:
        truncated = sum(len(row) > max_length for row in ids)
        ids = [row[-max_length:] for row in ids]
    longest = max((len(row) for row in ids), default=1)
    input_ids = torch.full((len(ids), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), longest), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, :len(row)] = 1
    return RewardModelInputs(input_ids, attention_mask, truncated, texts)
