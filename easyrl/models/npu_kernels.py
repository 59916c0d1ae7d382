"""Ascend NPU fused kernels for RMSNorm, the rotary embedding and the SwiGLU MLP (``torch_npu``).

With ``worker.actor.model.npu_fused_kernels`` (``trainer.device=npu`` only), on the actor and reference: every
``*RMSNorm`` forward with ``variance_epsilon`` becomes ``npu_rms_norm``; every SiLU ``*MLP`` with
``gate_proj``/``up_proj``/``down_proj`` becomes ``down(npu_swiglu(cat(gate(x), up(x))))``; the text
``apply_rotary_pos_emb`` of the modeling modules in :func:`fused_rotary_modules` (the registry's ``halves_rotary``
families) becomes ``npu_rotary_mul`` (on the rotary channels only where the rotary is partial; mRoPE and vision
rotaries unchanged; GLM-4's interleaved rotary and unlisted modules keep transformers'). Same arithmetic as
transformers' modules (``tests/test_npu_kernels.py``, on the CPU); not yet run on an NPU.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Optional

import torch


def apply_npu_fused_kernels(model: torch.nn.Module, npu: Optional[Any] = None) -> dict[str, int]:
    """Swap the fused kernels of ``npu`` (``torch_npu``, imported when None) into a transformers ``model`` of a
    registry family, in place, before ``fully_shard``; returns how many modules/functions were replaced per kind
    (``rms_norm``, ``swiglu``, ``rotary``: modules of :func:`fused_rotary_modules` only)."""
    npu = npu if npu is not None else importlib.import_module("torch_npu")
    counts = {"rms_norm": 0, "swiglu": 0, "rotary": 0}
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm") and hasattr(module, "variance_epsilon") and hasattr(module, "weight"):
            module.forward = types.MethodType(_rms_norm_forward(npu), module)
            counts["rms_norm"] += 1
        elif name.endswith("MLP") and all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")) \
                and type(getattr(module, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation"):
            module.forward = types.MethodType(_swiglu_forward(npu), module)
            counts["swiglu"] += 1
    for module_name in {type(m).__module__ for m in model.modules()} & fused_rotary_modules():
        modeling = sys.modules.get(module_name)
        if modeling is not None and hasattr(modeling, "apply_rotary_pos_emb"):
            modeling.apply_rotary_pos_emb = _rotary(npu)
            counts["rotary"] += 1
    return counts


def fused_rotary_modules() -> frozenset[str]:
    """Names of the transformers modeling modules (as ``type(module).__module__`` gives them) whose
    ``apply_rotary_pos_emb`` ``npu_rotary_mul`` computes: the module of each ``FAMILIES`` entry with
    ``halves_rotary`` (its config class's module, ``configuration_`` -> ``modeling_``: Gemma 3 text lives in
    ``gemma3``). A VL model's text model counts as its own family (InternVL's Qwen2 module is Qwen2's)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from easyrl.models.families import FAMILIES

    return frozenset(CONFIG_MAPPING[model_type].__module__.replace(".configuration_", ".modeling_")
                     for model_type, entry in FAMILIES.items() if entry.halves_rotary)


def _rms_norm_forward(npu):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return npu.npu_rms_norm(hidden_states, self.weight, epsilon=self.variance_epsilon)[0]

    return forward


def _swiglu_forward(npu):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(npu.npu_swiglu(torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1), dim=-1))

    return forward


def _rotary(npu):
    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        d = cos.shape[-1]  # < head_dim for a partial rotary (Qwen3.5/Qwen3-Next: partial_rotary_factor 0.25)

        def rotate(x):
            if d == x.shape[-1]:
                return npu.npu_rotary_mul(x, cos, sin)
            return torch.cat([npu.npu_rotary_mul(x[..., :d].contiguous(), cos, sin), x[..., d:]], dim=-1)

        return rotate(q), rotate(k)

    return apply_rotary_pos_emb
