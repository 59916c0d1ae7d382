"""The hooks a VL policy (or critic) needs in every forward: blank images, so that every rank runs the vision
tower as many times per micro-batch, and response pad ids hidden from the placeholder check.

``VisionHooks`` wraps one sharded model (nothing on a text model); family differences come from its registry entry
(``easyrl.models.families``). ``model_inputs`` arms the hooks for one micro-batch and yields its device tensors.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
from torch.utils._pytree import tree_leaves

from easyrl.batch import Batch
from easyrl.models.families import family
from easyrl.models.mrope import text_after_vision
from easyrl.workers.policy_forward import ModelInputs
from easyrl.workers.vl_tokens import mm_token_type_ids, stray_pads, visual_pad_ids

__all__ = ["VisionHooks", "merge_multimodal"]

MODALITY_KEYS = ("pixel_values", "pixel_values_videos")  # one vision-tower pass each


class VisionHooks:
    """The VL hooks of one (sharded) Hugging Face model, installed at construction (none without a vision tower:
    ``has_vision``); ``pad_ids``: ``{token id: mm type}`` of the image/video pad tokens."""

    def __init__(self, model: torch.nn.Module, hf_config) -> None:
        self.model = model
        self.has_vision = getattr(hf_config, "vision_config", None) is not None
        self.family = family(hf_config)
        self.pad_ids = visual_pad_ids(hf_config)
        self.tower_passes = 1  # vision-tower passes per micro-batch on every rank (agreed by FSDPTrainable)
        self.blank_passes = 0
        self.stray_pads: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        if self.has_vision:
            model.get_input_embeddings().register_forward_hook(self.blank_image_hook)
            inner = getattr(model, "model", model)  # Llama 4 keeps its parts on the model itself
            if hasattr(inner, "get_placeholder_mask"):  # Idefics3 has none (vLLM forbids its pads anyway)
                self._model_placeholder_mask = inner.get_placeholder_mask
                inner.get_placeholder_mask = self.placeholder_mask
            if self.family.mrope:
                inner.get_rope_index = text_after_vision(inner.get_rope_index)  # vLLM's positions

    @contextmanager
    def model_inputs(self, micro: Batch, device: torch.device) -> Iterator[ModelInputs]:
        """One micro-batch's tensors on ``device`` (:class:`ModelInputs`), with the hooks armed until the block ends:
        ``tower_passes`` minus its modalities blank images, its stray response pads hidden."""
        input_ids = micro["input_ids"].to(device)
        attention_mask = micro["attention_mask"].to(device)
        multi_modal = merge_multimodal(micro.extras.get("multi_modal_inputs", []), device, self.family.image_dim)
        prompt_len = input_ids.shape[1] - micro["response_mask"].shape[1]
        mrope = self.family.mrope and any(key in multi_modal for key in MODALITY_KEYS)  # types only with images
        response_mask = micro["response_mask"].to(device)  # 0 on tool turns: their pads are images
        types = mm_token_type_ids(input_ids, prompt_len, self.pad_ids, response_mask) if mrope else None
        stray = stray_pads(input_ids, prompt_len, self.pad_ids, response_mask) if self.pad_ids else None
        if stray is not None and stray.any():  # see placeholder_mask
            self.stray_pads = (stray, attention_mask.bool())
        if self.has_vision:
            self.blank_passes = self.tower_passes - sum(key in multi_modal for key in MODALITY_KEYS)
        try:
            routed = micro["routed_experts"].to(device) if "routed_experts" in micro else None
            yield ModelInputs(input_ids, attention_mask, response_mask, multi_modal, types, routed)
        finally:
            self.blank_passes = 0
            self.stray_pads = None

    def local_passes(self, data: Batch) -> int:
        """Vision-tower passes a micro-batch of ``data`` may need: 0 on a text model, else 1 or, when ``data`` holds
        both images and videos, 2. The ranks agree on the maximum (``tower_passes``) before their micro-batches run."""
        if not self.has_vision:
            return 0
        inputs = [sample for sample in data.extras.get("multi_modal_inputs", []) if sample]
        return max(1, sum(any(key in sample for sample in inputs) for key in MODALITY_KEYS))

    def blank_image_hook(self, module: torch.nn.Module, args: Any, embeds: torch.Tensor) -> torch.Tensor:
        """Forward hook of the token embedding of a VL model: add 0 * the vision tower's output on one small blank
        image (the family's ``blank_image``) to the embeddings ``(bsz, seq_len, hidden)``, ``blank_passes`` times.
        FSDP2 gathers and reduce-scatters blocks collectively in forward order, so every rank must run the tower at
        the same point of every micro-batch if any does (else a hang); images and videos take one pass each. Running
        it here, right before the model encodes images, reproduces an image batch's order."""
        for _ in range(self.blank_passes):
            inputs = {key: value.to(embeds.device) if isinstance(value, torch.Tensor) else value
                      for key, value in self.family.blank_image(self.model.config).items()}
            features = [t for t in tree_leaves(getattr(self.model, "model", self.model).get_image_features(**inputs))
                        if isinstance(t, torch.Tensor) and t.is_floating_point()]
            embeds = embeds + sum(t.sum() for t in features).to(embeds.dtype) * 0.0
        return embeds

    def placeholder_mask(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor, **features):
        """Qwen-VL's ``get_placeholder_mask``, blind to pad ids sampled in a response: those stay text tokens, as in
        vLLM, and the count check passes. Works on the padded ``(bsz, P + R)`` and packed ``(1, tokens)`` layouts."""
        if self.stray_pads is not None:
            stray, valid = self.stray_pads
            if stray.shape != input_ids.shape:  # packed: the valid positions, row-major (easyrl.models.packing)
                stray = stray[valid].view(input_ids.shape)
            input_ids = input_ids.masked_fill(stray, -1)
        return self._model_placeholder_mask(input_ids, inputs_embeds, **features)


def merge_multimodal(mm_inputs: list[dict[str, torch.Tensor]], device: torch.device,
                     dim: int = 0) -> dict[str, torch.Tensor]:
    """Concatenate per-sample processor outputs (e.g. ``pixel_values`` ``(patches, dim)``, ``image_grid_thw``
    ``(images, 3)``) along ``dim`` in sample order (the pad tokens' order), zero-padding smaller trailing dimensions."""
    merged: dict[str, list[torch.Tensor]] = defaultdict(list)
    for sample in mm_inputs:
        for key, value in sample.items():
            merged[key].append(value)
    return {key: torch.cat(_pad_trailing(values, dim), dim=dim).to(device) for key, values in merged.items()}


def _pad_trailing(values: list[torch.Tensor], dim: int) -> list[torch.Tensor]:
    """``values`` with every dimension after ``dim`` zero-padded at its end to the largest size among them."""
    if len(values) < 2 or values[0].dim() <= dim + 1:
        return values
    sizes = [max(v.shape[d] for v in values) for d in range(dim + 1, values[0].dim())]
    padded = []
    for value in values:
        pad = [p for d, size in reversed(list(enumerate(sizes, dim + 1))) for p in (0, size - value.shape[d])]
        padded.append(torch.nn.functional.pad(value, pad) if any(pad) else value)
    return padded

