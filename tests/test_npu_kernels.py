"""The NPU fused-kernel switch (easyrl.models.npu_kernels) on the CPU: with reference implementations of torch_npu's
npu_rms_norm / npu_swiglu / npu_rotary_mul (their documented arithmetic), the patched models compute the same logits."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from easyrl.models.npu_kernels import apply_npu_fused_kernels


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


FAKE_NPU = types.SimpleNamespace(
    npu_rms_norm=lambda x, w, epsilon: (
        w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)).to(x.dtype), None),
    npu_swiglu=lambda x, dim: torch.nn.functional.silu(x.chunk(2, dim=dim)[0]) * x.chunk(2, dim=dim)[1],
    npu_rotary_mul=lambda x, r1, r2: x * r1 + _rotate_half(x) * r2,
)


@pytest.mark.parametrize("arch, kinds", [("qwen2_5", {"rms_norm", "swiglu", "rotary"}),
                                         ("qwen2_5_vl", {"rms_norm", "swiglu"}),
                                         ("qwen3_5", {"swiglu", "rotary"})])  # partial rotary (factor 0.25)
def test_fused_kernels_compute_the_same_logits(tiny_model_path, monkeypatch, arch, kinds):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cls = AutoModelForImageTextToText if arch.endswith("vl") else AutoModelForCausalLM
    model = cls.from_pretrained(tiny_model_path(arch), dtype=torch.float32)
    for name in {type(m).__module__ for m in model.modules()}:  # undo the module-level rotary swap afterwards
        if hasattr(sys.modules.get(name), "apply_rotary_pos_emb"):
            monkeypatch.setattr(sys.modules[name], "apply_rotary_pos_emb", sys.modules[name].apply_rotary_pos_emb)
    ids = torch.randint(100, 5000, (2, 12), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(12)[None].expand(2, -1)
    with torch.no_grad():
        before = model(input_ids=ids, position_ids=positions).logits
        counts = apply_npu_fused_kernels(model, npu=FAKE_NPU)
        after = model(input_ids=ids, position_ids=positions).logits
    assert {k for k, n in counts.items() if n > 0} >= kinds, counts
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_npu_moe_experts_run_the_eager_loop(tiny_model_path):
    """torch_npu 2.10 has no PrivateUse1 kernel for ``torch._grouped_mm`` (transformers' default experts): on NPU the
    actor's MoE experts run the eager loop, which computes the same logits."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from easyrl.workers.fsdp_model import build_empty_model

    path = tiny_model_path("qwen3_5_moe")
    config = AutoConfig.from_pretrained(path)
    chosen = {d: build_empty_model(config, torch.float32, False, "sdpa", d).config.text_config._experts_implementation
              for d in ("cpu", "npu")}
    assert chosen == {"cpu": "grouped_mm", "npu": "eager"}
    ids = torch.randint(100, 5000, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = [AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, **kw)(input_ids=ids).logits
              for kw in ({}, {"experts_implementation": "eager"})]
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)


def test_the_halves_rotary_trait_is_the_modeling_module_s_rotate_half():
    """``halves_rotary`` (the fused rotary's allow-list) holds exactly for the families whose modeling module's
    ``rotate_half`` rotates the two halves (transformers as installed); GLM-4's rotates interleaved pairs, and the VL
    families without a rotary of their own (their text model is a family of its own) are not listed."""
    import importlib

    from easyrl.models.families import FAMILIES
    from easyrl.models.npu_kernels import fused_rotary_modules

    x = torch.randn(3, 8)
    halves = {}
    for module_name in {f"transformers.models.{p}.modeling_{p}" for p in ("glm4", "internvl", "llama")} | \
            fused_rotary_modules():
        modeling = importlib.import_module(module_name)
        rotate = getattr(modeling, "rotate_half", None)
        halves[module_name] = rotate is not None and hasattr(modeling, "apply_rotary_pos_emb") and \
            torch.equal(rotate(x), _rotate_half(x))
    assert {name for name, yes in halves.items() if yes} == fused_rotary_modules()
    assert not FAMILIES["glm4"].halves_rotary and "transformers.models.gemma3.modeling_gemma3" in fused_rotary_modules()
    assert len(fused_rotary_modules()) == sum(entry.halves_rotary for entry in FAMILIES.values()) == 17


def test_glm4_keeps_its_interleaved_rotary():
    """GLM-4's ``rotate_half`` pairs channels ``0::2`` / ``1::2`` (device review 2026-12-02, S2-N4): the fused rotary
    (the halves form) is not swapped in, and the patched model computes the same logits."""
    from transformers import Glm4ForCausalLM

    from easyrl.testing.tiny_families import tiny_family_config

    config = tiny_family_config("glm4")
    config.update(dict(vocab_size=512, num_hidden_layers=1))
    torch.manual_seed(0)
    model = Glm4ForCausalLM(config).eval()
    modeling = sys.modules[type(model).__module__]
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        counts = apply_npu_fused_kernels(model, npu=FAKE_NPU)
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    assert counts["rotary"] == 0 and modeling.apply_rotary_pos_emb.__module__ == modeling.__name__
