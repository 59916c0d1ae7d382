"""The transformers class easyrl builds for a config, by name (no model built): what the twin, the self-check and the
VL hooks of a family outside the registry read (``easyrl.models.twin``, ``easyrl.trainer.selfcheck``,
``easyrl.models.families``)."""

from __future__ import annotations

from typing import Any

__all__ = ["model_class_name", "TwinError"]


class TwinError(ValueError):
    """The config cannot be shrunk into a model both transformers and vLLM build (the message says why)."""


def model_class_name(hf_config: Any) -> str:
    """The transformers class easyrl builds for the config (``hf_model_class``'s mapping: image-text where the config
    has a ``vision_config``, else causal LM). Raises ``TwinError`` when transformers maps none."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    vision = getattr(hf_config, "vision_config", None) is not None
    mapping = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if vision else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    name = mapping.get(hf_config.model_type)
    if isinstance(name, (list, tuple)):
        name = name[0]
    if name is None:
        kind = "image-text-to-text" if vision else "causal LM"
        raise TwinError(f"model_type {hf_config.model_type!r}: transformers maps no {kind} class to it")
    return name
