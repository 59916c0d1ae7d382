"""Image/video pad tokens of Qwen-VL models: forbidden in sampling, and harmless if a response contains one anyway.

The model replaces exactly the prompt's pad embeddings with vision features and checks the counts; a sampled pad id
in a response would break that check ("Image features and image tokens do not match"). So the rollout forbids these
ids (vLLM ``bad_words``), and the actor marks only the prompt's pads as visual and embeds a stray response pad as the
text token it is, as vLLM does. The pads' probability mass the actor includes and vLLM drops is ~0 for a trained model.
"""

from __future__ import annotations

from typing import Optional

import torch

PAD_TOKEN_KEYS = {"image_token_id": 1, "video_token_id": 2}  # config key -> mm_token_type_ids value


def visual_pad_ids(hf_config) -> dict[int, int]:
    """``{token id: mm type}`` of the model's image (type 1) and video (type 2) pad tokens; ``{}`` for text models."""
    if getattr(hf_config, "vision_config", None) is None:
        return {}
    return {int(getattr(hf_config, key)): kind for key, kind in PAD_TOKEN_KEYS.items()
            if getattr(hf_config, key, None) is not None}


def forbidden_words(hf_config, tokenizer) -> list[str]:
    """The pad tokens as strings for vLLM's ``SamplingParams(bad_words=...)`` (text, not ids).

    Raises:
        ValueError: a pad token's text does not encode back to exactly its own id (names the token and ids)."""
    words = []
    for token_id in visual_pad_ids(hf_config):
        word = tokenizer.convert_ids_to_tokens(token_id)
        encoded = tokenizer.encode(word, add_special_tokens=False)
        if encoded != [token_id]:
            raise ValueError(f"Pad token id {token_id} ({word!r}) encodes to {encoded} with the rollout tokenizer, "
                             "not to itself: the tokenizer does not match the model config.")
        words.append(word)
    return words


def mm_token_type_ids(input_ids: torch.Tensor, prompt_len: int, pad_ids: dict[int, int],
                      response_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(bsz, seq_len)`` int64: the pad type (1 image, 2 video) at the prompt's pad tokens and at those of tool
    turns (``response_mask`` 0: images a tool returned), 0 elsewhere, as the Qwen-VL processor marks them.

    Args:
        input_ids: ``(bsz, seq_len)``, the (left-padded) prompt in the first ``prompt_len`` columns, then the response.
        pad_ids: ``visual_pad_ids(hf_config)``.
        response_mask: ``(bsz, seq_len - prompt_len)``, 1 on generated tokens; None: every response token is.
    """
    types = torch.zeros_like(input_ids)
    for token_id, kind in pad_ids.items():
        types[:, :prompt_len][input_ids[:, :prompt_len] == token_id] = kind
        if response_mask is not None:
            types[:, prompt_len:][(input_ids[:, prompt_len:] == token_id) & (response_mask == 0)] = kind
    return types


def stray_pads(input_ids: torch.Tensor, prompt_len: int, pad_ids: dict[int, int],
               response_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(bsz, seq_len)`` bool: True at pad ids in the response part (columns from ``prompt_len`` on) that were
    generated (``response_mask`` 1; None: all), not those of a tool's image."""
    stray = torch.zeros_like(input_ids, dtype=torch.bool)
    response = input_ids[:, prompt_len:]
    for token_id in pad_ids:
        stray[:, prompt_len:] |= response == token_id
    if response_mask is not None:
        stray[:, prompt_len:] &= response_mask.bool()
    return stray
