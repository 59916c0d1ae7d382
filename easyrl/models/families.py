"""The model families easyrl runs: one registry (:data:`FAMILIES`), keyed by transformers' ``model_type``.

Every family runs the same generic path; code branches on an entry's traits (``vision``, ``router``, ``mrope``, ...) or
small hooks (``positions``: text positions as vLLM counts them; ``logit_scale``: the head's logit factor). A type
missing here runs with the generic entry if its self-check passes (``easyrl.trainer.selfcheck``: a tiny twin through
the parity checks, before Ray), and is refused otherwise (:func:`check_supported`); adding one: docs/models.md,
"Adding a family".
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from easyrl.errors import ModelError
from easyrl.models.packing import padded_text_positions
from easyrl.models.router_replay import SOFTMAX_TOPK, TOPK_SOFTMAX, RouterKind

__all__ = ["Family", "FAMILIES", "family", "text_config", "check_supported", "attends_in_windows", "attends_in_chunks",
           "gated_deltanet", "vision_parts", "tower_exclude", "DOCS"]

DOCS = "docs/models.md"


def text_config(hf_config: Any) -> Any:
    """The language model's part of ``hf_config`` (a vision-language model's ``text_config``; a text model's config
    itself, as transformers' ``get_text_config`` gives it); ``hf_config`` itself for an object without that method."""
    return hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config


def _merge(hf_config: Any) -> int:
    """The tower's token merge per side (patches of one output token along each axis): ``spatial_merge_size``
    (Qwen-VL, Pixtral), ``scale_factor`` (Idefics3's pixel shuffle), ``downsample_factor`` (LFM2-VL); 1 with none."""
    vision = hf_config.vision_config
    for holder, key in ((vision, "spatial_merge_size"), (hf_config, "spatial_merge_size"), (hf_config, "scale_factor"),
                        (hf_config, "downsample_factor")):
        value = getattr(holder, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 1


def _channels(vision: Any) -> int:
    return getattr(vision, "in_channels", None) or getattr(vision, "num_channels", None) or 3


def _patch_grid_blank(hf_config: Any) -> dict[str, Any]:
    """Qwen-VL / GLM-4V (a tower that takes flattened patches and their ``image_grid_thw``): one image of ``merge x
    merge`` patches, each ``channels * temporal_patch_size * patch_size**2`` values (a tower without a temporal patch
    takes one frame)."""
    vision = hf_config.vision_config
    merge = _merge(hf_config)
    patch_dim = _channels(vision) * (getattr(vision, "temporal_patch_size", None) or 1) * vision.patch_size**2
    return {"pixel_values": torch.zeros(merge * merge, patch_dim), "image_grid_thw": torch.tensor([[1, merge, merge]])}


def _feature_choice(hf_config: Any) -> dict[str, Any]:
    """The vision-feature layer (and selection) the model's forward passes its ``get_image_features``."""
    keys = ("vision_feature_layer", "vision_feature_select_strategy")
    return {key: getattr(hf_config, key) for key in keys if getattr(hf_config, key, None) is not None}


def _tile_blank(hf_config: Any) -> dict[str, Any]:
    """InternVL (and a CLIP / SigLIP-like tower): one image of the tower's input size (``(1, 3, H, W)``)."""
    size = hf_config.vision_config.image_size
    height, width = (size, size) if isinstance(size, int) else size
    return {"pixel_values": torch.ones(1, 3, height, width), **_feature_choice(hf_config)}


def _pixtral_blank(hf_config: Any) -> dict[str, Any]:
    """Mistral 3 (Pixtral tower, any image size with its ``image_sizes``): one image of ``merge x 2 merge`` patches,
    two tokens (with one, Mistral 3's projector squeezes the token axis away: transformers 5.19)."""
    side = hf_config.vision_config.patch_size * _merge(hf_config)
    return {"pixel_values": torch.ones(1, 3, side, 2 * side), "image_sizes": torch.tensor([[side, 2 * side]]),
            **_feature_choice(hf_config)}


def _anyres_blank(hf_config: Any) -> dict[str, Any]:
    """LLaVA-NeXT / -OneVision: one image of the tower's input size, as its tiles (``(1, tiles, 3, S, S)``: the base
    one and the grid's) and its ``image_sizes``."""
    from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

    side = hf_config.vision_config.image_size
    tiles = image_size_to_num_patches((side, side), hf_config.image_grid_pinpoints, side)
    return {"pixel_values": torch.ones(1, tiles, 3, side, side), "image_sizes": torch.tensor([[side, side]]),
            **_feature_choice(hf_config)}


def _idefics3_blank(hf_config: Any) -> dict[str, Any]:
    """Idefics3 / SmolVLM: one tile of ``merge x merge`` patches (``(1, 1, 3, S, S)`` with its pixel mask; the tower
    positions a smaller tile's patches in its grid); ones, as an all-zero tile counts as padding. Not the tower's
    ``image_size``: its patch grid need not divide by the pixel shuffle's scale (transformers' default config: 224 /
    32 = 7 patches, scale 2)."""
    side = hf_config.vision_config.patch_size * _merge(hf_config)
    return {"pixel_values": torch.ones(1, 1, 3, side, side),
            "pixel_attention_mask": torch.ones(1, 1, side, side, dtype=torch.bool)}


def _naflex_blank(hf_config: Any) -> dict[str, Any]:
    """A SigLIP 2 (NaFlex) tower (LFM2-VL): ``merge x merge`` flattened patches, their mask and ``spatial_shapes``."""
    vision, merge = hf_config.vision_config, _merge(hf_config)
    patch_dim = _channels(vision) * vision.patch_size**2
    return {"pixel_values": torch.ones(1, merge * merge, patch_dim),
            "pixel_attention_mask": torch.ones(1, merge * merge, dtype=torch.long),
            "spatial_shapes": torch.tensor([[merge, merge]])}


def _row_of_patches_blank(hf_config: Any) -> dict[str, Any]:
    """MiniCPM-V 4.6: one image of ``4 x 4`` patches laid in one row (``(1, 3, P, 16 P)``) and its ``target_sizes``
    (the grid in patches; the window kernel and the two 2x2 mergers divide it)."""
    vision = hf_config.vision_config
    patch = vision.patch_size
    return {"pixel_values": torch.ones(1, _channels(vision), patch, 16 * patch), "target_sizes": torch.tensor([[4, 4]])}


# the tower's input layout, by the parameter of ``get_image_features`` that names it (first match)
_BLANK_BY_PARAMETER: tuple[tuple[str, Callable[[Any], dict[str, Any]]], ...] = (
    ("image_grid_thw", _patch_grid_blank),
    ("spatial_shapes", _naflex_blank),
    ("target_sizes", _row_of_patches_blank),
    ("pixel_attention_mask", _idefics3_blank),
)


def _generic_blank(hf_config: Any) -> dict[str, Any]:
    """A family outside the registry: the layout its ``get_image_features`` names (:data:`_BLANK_BY_PARAMETER`;
    ``image_sizes``: anyres tiles where the config has ``image_grid_pinpoints``, else Pixtral's any-size image), else
    one image of the tower's input size; only the keyword arguments the method names."""
    from easyrl.models.model_class import model_class_name

    parameters = _image_features_parameters(model_class_name(hf_config))
    blank = next((make for name, make in _BLANK_BY_PARAMETER if name in parameters), None)
    if blank is None and "image_sizes" in parameters:
        blank = _anyres_blank if getattr(hf_config, "image_grid_pinpoints", None) else _pixtral_blank
    return {key: value for key, value in (blank or _tile_blank)(hf_config).items() if key in parameters}


@functools.lru_cache(maxsize=None)
def _image_features_parameters(class_name: str) -> frozenset[str]:
    """The named parameters of ``get_image_features`` of transformers class ``class_name``, or of its base model's
    where the class only passes its arguments on (``*args, **kwargs``: MiniCPM-V)."""
    import inspect
    import sys

    import transformers

    cls = getattr(transformers, class_name)
    candidates = [cls] + [value for value in vars(sys.modules[cls.__module__]).values()
                          if isinstance(value, type) and "get_image_features" in vars(value)]
    for candidate in candidates:
        parameters = inspect.signature(candidate.get_image_features).parameters
        if "pixel_values" in parameters:
            return frozenset(parameters)
    return frozenset(("pixel_values",))


def config_logit_scale(hf_config: Any) -> float:
    """The head's logit factor as the (text) config states it: Cohere's ``logits = lm_head(hidden) * logit_scale``
    (``CohereForCausalLM.forward``), Granite's ``logits = lm_head(hidden) / logits_scaling``; 1.0 with neither."""
    text = text_config(hf_config)
    return (getattr(text, "logit_scale", None) or 1.0) / (getattr(text, "logits_scaling", None) or 1.0)


@dataclass(frozen=True)
class Family:
    """What easyrl knows of one model family (one transformers ``model_type``)."""

    name: str
    """The family as users call it (docs/models.md's first column)."""
    vision: bool = False
    """Image-text model (a vision tower and placeholder tokens)."""
    router: Optional[RouterKind] = None
    """Mixture of experts: how its router returns and weighs its top-k (``easyrl.models.router_replay``, what
    routing replay follows); None: dense MLPs."""
    mrope: bool = False
    """Positions are Qwen-VL's multimodal rotary (3-D) ones; else 1-D rotary positions."""
    linear_attention: bool = False
    """Has linear-attention (Gated DeltaNet) layers."""
    sliding_window: bool = False
    """Has sliding-window attention layers (as its released configs set them); what a forward does is decided by the
    checkpoint's own config (:func:`attends_in_windows`)."""
    halves_rotary: bool = False
    """Its modeling module's ``apply_rotary_pos_emb`` is ``x * cos + rotate_half(x) * sin`` (on the first
    ``cos.shape[-1]`` channels) with ``rotate_half`` over the two halves, as transformers 5.19 writes it: what
    torch_npu's ``npu_rotary_mul`` computes, so ``npu_fused_kernels`` may swap it in (``easyrl.models.npu_kernels``).
    GLM-4 rotates interleaved pairs; the VL families whose module has no rotary leave it to their text model's
    family (InternVL's Qwen2, Mistral 3's Mistral)."""
    positions: Callable[[torch.Tensor], torch.Tensor] = padded_text_positions
    """Hook: ``(bsz, L)`` attention mask -> ``(bsz, L)`` text positions (0 at the first real token, no padding
    counted), as vLLM numbers the tokens."""
    logit_scale: Callable[[Any], float] = config_logit_scale
    """Hook: the transformers config -> the factor the model's head multiplies its logits by (default: what the
    config's ``logit_scale`` / ``logits_scaling`` say)."""
    transposed_experts: tuple[str, ...] = ()
    """Name suffixes of the fused expert tensors the released checkpoints store transposed, ``(experts, in, out)``,
    as the weight sync and the export write them (``easyrl.models.expert_layout``, as the two fields below)."""
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    """``(in-memory, released)`` name parts where transformers renames a module on load (Mixtral's ``block_sparse_moe``
    is ``mlp``; LLaVA-OneVision's SigLIP tower drops ``vision_model``, and saves so, which vLLM refuses)."""
    per_expert_names: tuple[str, ...] = ()
    """``(gate, up, down)``: vLLM takes this family's experts one tensor per expert under these names (Mixtral's
    ``w1``, ``w3``, ``w2``), split from transformers' fused ones; empty: vLLM takes the fused tensors."""
    blank_image: Callable[[Any], dict[str, Any]] = _generic_blank
    """VL hook: the transformers config -> ``get_image_features`` keyword arguments of one small blank image (the
    tower passes that keep the ranks' collectives equal, ``easyrl.workers.vl_hooks``)."""
    image_dim: int = 0
    """VL: the dimension along which several samples' processor outputs (``pixel_values``, ...) concatenate
    (Idefics3's ``(1, tiles, ...)``: 1); smaller trailing dimensions are zero-padded (Pixtral's ``image_sizes``)."""
    vision_tower: str = ""
    """VL: the vision tower's module path in transformers' model (Qwen-VL's ``model.visual``, its projector inside),
    what ``freeze_vision_tower`` freezes and LoRA's default ``exclude_modules`` keeps without adapters; empty for an
    unlisted family: found by name (:func:`vision_parts`)."""
    projector: str = ""
    """VL: the module path of the tower's projector where it sits beside the tower (``model.multi_modal_projector``),
    kept without adapters with the tower; empty where it is inside the tower."""

    @property
    def moe(self) -> bool:
        """Routed experts in its MLPs."""
        return self.router is not None


_QWEN_VL = dict(vision=True, mrope=True, halves_rotary=True, blank_image=_patch_grid_blank, vision_tower="model.visual")
_LLAVA_PARTS = dict(vision=True, vision_tower="model.vision_tower", projector="model.multi_modal_projector")
FAMILIES: dict[str, Family] = {
    # text, dense
    "qwen2": Family("Qwen2 / Qwen2.5", halves_rotary=True),
    "qwen3": Family("Qwen3", halves_rotary=True),
    "llama": Family("Llama 3 / SmolLM2", halves_rotary=True),
    "gemma3_text": Family("Gemma 3 (text)", halves_rotary=True, sliding_window=True),
    "mistral": Family("Mistral", halves_rotary=True, sliding_window=True),
    "phi3": Family("Phi-3 / Phi-4", halves_rotary=True),
    "glm4": Family("GLM-4"),
    "granite": Family("Granite 3", halves_rotary=True),
    # text, mixture of experts
    "qwen3_moe": Family("Qwen3-MoE", router=SOFTMAX_TOPK, halves_rotary=True),
    "mixtral": Family("Mixtral", router=SOFTMAX_TOPK, halves_rotary=True,
                      checkpoint_renames=((".mlp.", ".block_sparse_moe."),), per_expert_names=("w1", "w3", "w2")),
    "olmoe": Family("OLMoE", router=SOFTMAX_TOPK, halves_rotary=True),
    "granitemoe": Family("Granite 3 MoE", router=TOPK_SOFTMAX, halves_rotary=True),
    # vision-language
    "qwen2_vl": Family("Qwen2-VL", **_QWEN_VL),
    "qwen2_5_vl": Family("Qwen2.5-VL", **_QWEN_VL),
    "qwen3_vl": Family("Qwen3-VL", **_QWEN_VL),
    "qwen3_vl_moe": Family("Qwen3-VL-MoE", router=SOFTMAX_TOPK, **_QWEN_VL,
                           transposed_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
    "qwen3_5": Family("Qwen3.5", linear_attention=True, **_QWEN_VL),
    "qwen3_5_moe": Family("Qwen3.5-MoE", router=SOFTMAX_TOPK, linear_attention=True, **_QWEN_VL),
    "internvl": Family("InternVL 3 (transformers format)", blank_image=_tile_blank, **_LLAVA_PARTS),
    "idefics3": Family("Idefics3", vision=True, blank_image=_idefics3_blank, image_dim=1,
                       vision_tower="model.vision_model", projector="model.connector"),
    "mistral3": Family("Mistral 3 (Pixtral vision)", blank_image=_pixtral_blank, **_LLAVA_PARTS),
    "llava_onevision": Family("LLaVA-OneVision", blank_image=_anyres_blank, **_LLAVA_PARTS,
                              checkpoint_renames=(("vision_tower.", "vision_tower.vision_model."),)),
}

_GENERIC = Family("unlisted")  # a model_type outside the registry (admitted by its self-check, or a test's model)
_GENERIC_MROPE = Family("unlisted", mrope=True)


def family(hf_config: Any) -> Family:
    """The registry entry of a transformers config (its top-level ``model_type``); for a type not listed, the generic
    entry (default traits and hooks, what its self-check ran with: ``easyrl.trainer.selfcheck``), with ``mrope`` where
    the config's text rotary has an ``mrope_section`` and the model numbers its 3-D positions itself (GLM-4.1V)."""
    entry = FAMILIES.get(getattr(hf_config, "model_type", None))
    if entry is not None:
        return entry
    return _GENERIC_MROPE if _has_mrope(hf_config) else _GENERIC


def _has_mrope(hf_config: Any) -> bool:
    text = text_config(hf_config)
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    return isinstance(rope, dict) and "mrope_section" in rope and getattr(hf_config, "vision_config", None) is not None


_TOWER = re.compile(r"visual|vision")  # an unlisted family's child of its inner model named as its vision tower
_PROJECTOR = re.compile(r"projector|connector")  # ... and as the tower's projector beside it


def vision_parts(model: Any) -> tuple[list[str], list[str]]:
    """``(tower paths, projector paths)`` of a transformers model (any device, meta included): its registry entry's
    :attr:`Family.vision_tower` / :attr:`Family.projector`; for an unlisted family, the children of its inner
    ``model`` named like a tower (``vision_tower``, ``vision_model``, ``visual``) or a projector (``connector``,
    ``multi_modal_projector``). Only paths the model holds; ``([], [])`` for a text model."""
    entry = family(model.config)
    if entry.vision_tower:
        paths = ([entry.vision_tower], [entry.projector] if entry.projector else [])
    else:
        inner = getattr(model, "model", None)
        names = [name for name, _ in inner.named_children()] if inner is not None else []
        paths = ([f"model.{n}" for n in names if _TOWER.search(n)],
                 [f"model.{n}" for n in names if _PROJECTOR.search(n)])
    held = {name for name, _ in model.named_modules()}
    return [p for p in paths[0] if p in held], [p for p in paths[1] if p in held]


def tower_exclude(model: Any) -> Optional[str]:
    """The ``lora.exclude_modules`` pattern that keeps the model's vision tower and its projector without adapters,
    as ``.*visual.*`` does for Qwen-VL (``.*(vision_tower|multi_modal_projector).*`` for InternVL); None for a text
    model."""
    towers, projectors = vision_parts(model)
    leaves = [path.rsplit(".", 1)[-1] for path in towers + projectors]
    if not leaves:
        return None
    return f".*{leaves[0]}.*" if len(leaves) == 1 else f".*({'|'.join(leaves)}).*"


def attends_in_windows(hf_config: Any) -> bool:
    """Whether some attention layer of the (text) model restricts its keys to a sliding window, as transformers 5.19
    reads the config: a non-null ``sliding_window`` (Mistral, Phi-3, Mixtral, Qwen3-MoE apply it to every layer; Qwen2
    and Qwen3 null it unless ``use_sliding_window``), or ``layer_types`` naming ``sliding_attention`` (Gemma 3). A
    config with a window on no layer (Qwen2 with ``max_window_layers`` = all layers) counts as windowed too: the
    answer errs towards the kernels that apply windows."""
    text = text_config(hf_config)
    return getattr(text, "sliding_window", None) is not None or "sliding_attention" in (
        getattr(text, "layer_types", None) or ())


def attends_in_chunks(hf_config: Any) -> bool:
    """Whether some attention layer of the (text) model attends only within fixed blocks of its sequence (chunked
    attention: ``layer_types`` naming ``chunked_attention``, ``attention_chunk_size`` tokens each: Llama 4's local
    layers), as transformers 5.19's ``create_chunked_causal_mask`` reads the config."""
    text = text_config(hf_config)
    return attention_chunk(hf_config) is not None and "chunked_attention" in (getattr(text, "layer_types", None) or ())


def gated_deltanet(hf_config: Any) -> bool:
    """Whether the (text) model has Gated DeltaNet layers (its config has ``linear_num_value_heads``: Qwen3-Next,
    Qwen3.5, OLMo-Hybrid), which vLLM-CPU runs only in bf16 ("CPU GDN attention requires BF16.", vLLM 0.32
    ``mamba/ops/cpu/gdn_attention.py``)."""
    text = text_config(hf_config)
    return bool(getattr(text, "linear_num_value_heads", None))


def latent_attention(hf_config: Any) -> bool:
    """Whether the (text) model has multi-head latent attention (its config has a ``kv_lora_rank``: DeepSeek-V2/V3,
    Kimi-K2, GLM-4.7-Flash), which vLLM 0.32's CPU platform runs with its AMX MLA backend where the CPU has AMX
    tiles, in bf16/fp16 only ("expect weight to be bfloat16, float16, ...", ``v1/attention/backends/mla/amx_mla.py``);
    its reference ``CPU_MLA`` backend runs fp32 too."""
    text = text_config(hf_config)
    return getattr(text, "kv_lora_rank", None) is not None


def attention_chunk(hf_config: Any) -> Optional[int]:
    """The (text) model's attention chunk in tokens (Llama 4's ``attention_chunk_size``), or None."""
    text = text_config(hf_config)
    chunk = getattr(text, "attention_chunk_size", None)
    return chunk if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0 else None


ENGINE_TEMPERATURE_LEN = 32768
"""Tokens: vLLM 0.32 turns Llama 4's NoPE-layer query temperature on only for a longer ``max_model_len``, unless the
generation config says (``model_executor/models/llama4.py``)."""


def engine_temperature_tuning(hf_config: Any, generation_config: dict, max_model_len: int) -> Optional[bool]:
    """Whether vLLM scales the queries of Llama 4's layers without rotary (``attn_temperature_tuning``, a factor
    ``1 + attn_scale * log(1 + floor((position + 1) / floor_scale))``; Llama 4 paper's long-context recipe) for an
    engine of ``max_model_len`` tokens: the generation config's ``attn_temperature_tuning``, else ``max_model_len`` >
    :data:`ENGINE_TEMPERATURE_LEN`. None for a config without the setting (not Llama 4)."""
    text = text_config(hf_config)
    if getattr(text, "attn_temperature_tuning", None) is None:
        return None
    return bool(generation_config.get("attn_temperature_tuning", max_model_len > ENGINE_TEMPERATURE_LEN))


def check_supported(key: str, hf_config: Any, why: str = "") -> None:
    """ModelError (naming ``key``, the ``model_type``, ``why`` and docs/models.md) for a family not in
    :data:`FAMILIES`; the pre-flight asks the self-check first (``easyrl.trainer.selfcheck.admit``)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        raise ModelError(f"{key}: model_type {model_type!r} is not a family easyrl runs (tested: "
                         f"{', '.join(sorted(FAMILIES))}){f' ({why})' if why else ''}; see {DOCS} for the supported "
                         "families and how to add one")
