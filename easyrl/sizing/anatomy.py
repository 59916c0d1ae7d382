"""A model's anatomy before anything is loaded: its widths (:class:`ModelShape`, :class:`VisionShape`) from its
``config.json``, its parameter and matmul-weight counts from one meta-device build (:func:`model_anatomy`); units."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from easyrl.config.role import DTYPES

GIB = 2**30
DTYPE_BYTES = {name: spec.bytes for name, spec in DTYPES.items()}


@dataclass(frozen=True)
class VisionShape:
    """The widths of a Qwen-VL vision tower (its ``vision_config``) and of the patches the processor cuts."""

    hidden_size: int
    depth: int
    intermediate_size: int
    gated: bool
    """The MLP has a gate (Qwen2/2.5-VL: gate, up, down) or not (Qwen3-VL: fc1, fc2)."""
    patch_size: int
    merge_size: int
    patch_dim: int
    """``in_channels x temporal_patch_size x patch_size^2``: the width of ``pixel_values``."""
    out_hidden_size: int = 0
    """Width of the image tokens the tower hands the language model."""
    mergers: int = 1
    """Patch mergers: the final one and Qwen3-VL's DeepStack mergers (``1 + len(deepstack_visual_indexes)``)."""
    position_embedding: bool = False
    """A learned position embedding, bilinearly interpolated to each image's grid (Qwen3-VL, Qwen3.5:
    ``num_position_embeddings``); Qwen2/2.5-VL have rotary positions only."""
    patch_weights: int = 0
    """Matmul weights applied per patch (patch embedding, blocks), counted by :func:`model_anatomy` (0: not counted)."""
    merge_weights: int = 0
    """Matmul weights applied per merged token (the patch mergers), counted by :func:`model_anatomy`."""


@dataclass(frozen=True)
class ModelShape:
    """The widths that size activations and FLOPs (the ``text_config``'s for VL models). ``intermediate_size``: the
    MLP width one token passes through (``top_k x moe_intermediate_size`` for MoE); ``tied``: the LM head is the
    input embedding."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    tied: bool
    routed_width: int = 0
    """Mixture of experts: ``num_experts_per_tok x hidden_size``, the width of the token copies routed to the
    experts (0: dense)."""
    linear_value_width: int = 0
    """Gated DeltaNet (linear attention, Qwen3.5): ``linear_num_value_heads x linear_value_head_dim`` (0: none)."""
    vision: "VisionShape | None" = None
    """The vision tower's widths (:func:`vision_shape`; None: a text model)."""
    attn_width: int = 0
    """``heads x head_dim`` of the language model's attention (set by :func:`model_anatomy`; 0: not read)."""
    text_weights: int = 0
    """Matmul weights applied per text token (language model + LM head; the embedding lookup is not a matmul),
    counted by :func:`model_anatomy` (0: not counted)."""
    largest_tensor: int = 0
    """Elements of the model's largest parameter (the embedding, or fused experts ``(experts, 2 I, H)``), counted by
    :func:`model_anatomy` (0: not counted)."""
    largest_layer: int = 0
    """Elements of the parameters of the largest decoder layer (a ``layers.N`` module), counted by
    :func:`model_anatomy` (0: not counted)."""


def mlp_width(text) -> int:
    """A dense MLP's hidden width: ``intermediate_size`` as most configs name it, OPT's ``ffn_dim``, GPT-2's
    ``n_inner`` (None there: ``4 x hidden_size``, as its MLP builds it)."""
    for key in ("intermediate_size", "ffn_dim", "n_inner"):
        if getattr(text, key, None):
            return int(getattr(text, key))
    return 4 * int(text.hidden_size)


def model_shape(hf_config) -> ModelShape:
    """:class:`ModelShape` of a Hugging Face config (reads attributes only; no weight counts)."""
    text = getattr(hf_config, "text_config", None) or hf_config
    moe = getattr(text, "moe_intermediate_size", None)
    top_k = getattr(text, "num_experts_per_tok", None)
    width = moe * top_k + (getattr(text, "shared_expert_intermediate_size", None) or 0) if moe and top_k \
        else mlp_width(text)
    tied = getattr(hf_config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False))
    routed = int(top_k) * int(text.hidden_size) if moe and top_k else 0
    heads, head_dim = getattr(text, "linear_num_value_heads", None), getattr(text, "linear_value_head_dim", None)
    linear = int(heads) * int(head_dim) if heads and head_dim else 0
    return ModelShape(int(text.hidden_size), int(text.num_hidden_layers), int(width), bool(tied), routed, linear,
                      vision_shape(hf_config))


def vision_shape(hf_config) -> "VisionShape | None":
    """:class:`VisionShape` of a Qwen-VL ``vision_config``; None without one, or for one the sizing does not model:
    only the patch-grid towers of the mRoPE families (Qwen-VL) are, not the tiles or whole images of the others
    (InternVL, Idefics3, Pixtral), whose tower is then not counted (``easyrl simulate`` refuses them). The
    processor's patch widths are the vision config's. Qwen2-VL names the tower's width ``embed_dim`` (its
    ``hidden_size`` is the merger's output)."""
    from easyrl.models.families import family

    vision = getattr(hf_config, "vision_config", None)
    if vision is None or not family(hf_config).mrope:
        return None
    patch, temporal = int(vision.patch_size), int(getattr(vision, "temporal_patch_size", 2))
    channels = int(getattr(vision, "in_channels", None) or getattr(vision, "in_chans", 3))
    embed_dim = getattr(vision, "embed_dim", None)
    hidden = int(embed_dim or vision.hidden_size)
    out = getattr(vision, "out_hidden_size", None) or (vision.hidden_size if embed_dim else 0)
    width = getattr(vision, "intermediate_size", None) or hidden * int(getattr(vision, "mlp_ratio", 4))
    gated = getattr(vision, "model_type", "") == "qwen2_5_vl_vision"  # Qwen2_5_VLMLP: gate, up, down
    return VisionShape(hidden, int(vision.depth), int(width), gated, patch, int(vision.spatial_merge_size),
                       channels * temporal * patch * patch, int(out),
                       1 + len(getattr(vision, "deepstack_visual_indexes", None) or []),
                       bool(getattr(vision, "num_position_embeddings", None)))


def split_parameters(params: int, vocab_size: int, shape: ModelShape, lm_head: bool = True) -> tuple[int, float]:
    """``(root, layer)`` parameters: FSDP2's root group (the embedding, and the LM head unless tied or not
    ``lm_head``) and one decoder layer (the rest over ``num_layers``)."""
    root = (2 if lm_head and not shape.tied else 1) * vocab_size * shape.hidden_size
    return root, max(params - root, 0) / shape.num_layers


def layer_values(config, key: str) -> list:
    """``key`` of the decoder layers: ``[value]`` where one value holds for all (None if the config has none), or
    each layer's own where it varies by layer (transformers' per-layer configs, Gemma 4's ``head_dim``: reading the
    global raises ``AmbiguousGlobalPerLayerAttributeError``, a ``RuntimeError``)."""
    try:
        return [getattr(config, key, None)]
    except RuntimeError:
        return [getattr(layer, key, None) for layer in config.per_layer_config]


def meta_model(hf_config, trust_remote_code: bool = False, classifier: bool = False):
    """The model of ``hf_config`` on the meta device (``hf_model_class``, or with ``classifier`` a sequence
    classifier), with SDPA attention where the class has it, else eager (only parameters are read)."""
    import torch

    from easyrl.models.hf_folder import hf_model_class, supports_sdpa

    if classifier:
        from transformers import AutoModelForSequenceClassification as model_class
    else:
        model_class = hf_model_class(hf_config)
    attn = "sdpa" if supports_sdpa(hf_config) else "eager"  # gpt-oss has no SDPA path (its attention sinks)
    with torch.device("meta"):
        return model_class.from_config(hf_config, dtype=torch.float32, trust_remote_code=trust_remote_code,
                                       attn_implementation=attn)


def vocab_size(hf_config) -> int:
    """Rows of the model's embedding (its ``text_config``'s for VL models)."""
    return int(getattr(getattr(hf_config, "text_config", hf_config), "vocab_size", None) or hf_config.vocab_size)


def model_anatomy(hf_config, trust_remote_code: bool = False) -> tuple[int, int, ModelShape]:
    """``(parameters, vocab size, shape)`` from one meta-device build: :func:`model_shape` with every matmul weight
    counted as text, per-patch or per-merged-token (``merger``), the attention width ``heads x head_dim``, the largest
    parameter and the largest decoder layer (elements)."""
    import torch

    model = meta_model(hf_config, trust_remote_code)
    counts = {"text": 0, "patch": 0, "merge": 0}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv3d)):
            kind = ("merge" if "merger" in name else "patch") if ".visual." in f".{name}." else "text"
            counts[kind] += module.weight.numel()
    text = getattr(hf_config, "text_config", None) or hf_config
    heads = text.num_attention_heads
    head_dim = max([value for value in layer_values(text, "head_dim") if value] or [text.hidden_size // heads])
    shape = model_shape(hf_config)
    vision = replace(shape.vision, patch_weights=counts["patch"], merge_weights=counts["merge"]) \
        if shape.vision is not None else None
    layers: dict[str, int] = {}
    for name, param in model.named_parameters():
        layer = re.match(r"(.*\blayers\.\d+)\.", name)
        if layer:
            layers[layer[1]] = layers.get(layer[1], 0) + param.numel()
    shape = replace(shape, vision=vision, attn_width=int(heads * head_dim), text_weights=counts["text"],
                    largest_tensor=max(p.numel() for p in model.parameters()), largest_layer=max(layers.values(),
                                                                                                default=0))
    return sum(p.numel() for p in model.parameters()), vocab_size(hf_config), shape
