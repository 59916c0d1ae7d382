"""Fused MoE experts between transformers' layout and the released checkpoints' (easyrl.models.expert_layout): the
conversion the weight sync applies for vLLM, and the tiny Qwen3-VL-MoE saved in the released layout."""

from __future__ import annotations

import pytest
import torch

from easyrl.models.expert_layout import needs_transpose, to_checkpoint_layout
from easyrl.models.families import FAMILIES

GATE_UP = "model.language_model.layers.0.mlp.experts.gate_up_proj"
DOWN = "model.language_model.layers.0.mlp.experts.down_proj"


def test_qwen3_vl_moe_experts_are_transposed_and_everything_else_passes_unchanged():
    gate_up, down = torch.randn(4, 128, 256), torch.randn(4, 256, 64)  # (experts, out, in) as F.linear
    router, attn = torch.randn(4, 256), torch.randn(256, 256)
    out = dict(to_checkpoint_layout([(GATE_UP, gate_up), (DOWN, down), ("model.language_model.layers.0.mlp.gate.weight",
                                     router), ("model.language_model.layers.0.self_attn.q_proj.weight", attn)],
                                    "qwen3_vl_moe"))
    assert out[GATE_UP].shape == (4, 256, 128) and out[DOWN].shape == (4, 64, 256)  # (experts, in, out)
    assert torch.equal(out[GATE_UP][2], gate_up[2].T) and torch.equal(out[DOWN][1], down[1].T)
    assert out[GATE_UP].is_contiguous()
    assert out["model.language_model.layers.0.mlp.gate.weight"] is router
    assert out["model.language_model.layers.0.self_attn.q_proj.weight"] is attn


@pytest.mark.parametrize("model_type", ["qwen3_5_moe", "qwen2_5_vl", "qwen3_moe"])
def test_models_stored_in_transformers_layout_pass_unchanged(model_type):
    tensor = torch.randn(4, 128, 256)
    assert next(to_checkpoint_layout([(GATE_UP, tensor)], model_type))[1] is tensor


def test_an_unfused_tensor_under_a_fused_name_is_refused():
    with pytest.raises(ValueError, match="down_proj.*fused"):
        list(to_checkpoint_layout([(DOWN, torch.randn(256, 64))], "qwen3_vl_moe"))


def test_the_registry_agrees_with_transformers_load_conversion():
    """transformers transposes exactly a MoE family's ``transposed_experts`` when it loads a released checkpoint of
    the model type, and nothing for the others (if it stopped, the released layout would equal its in-memory one and
    the sync must stop transposing; if a family started, the sync would hand vLLM the wrong layout)."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import Transpose

    for model_type, names in ((t, f.transposed_experts) for t, f in FAMILIES.items() if f.moe):
        transposed = {pattern for conv in get_checkpoint_conversion_mapping(model_type) or []
                      if any(isinstance(op, Transpose) for op in getattr(conv, "operations", []))
                      for pattern in conv.source_patterns}
        assert transposed == set(names), (model_type, transposed)


def test_tiny_qwen3_vl_moe_is_saved_in_the_released_layout_and_loads_back(tiny_model_path):
    """The saved experts are (experts, in, out) (what vLLM's Qwen3-VL-MoE loads), and transformers loads them back
    into its (experts, out, in) layout with the same values."""
    from safetensors import safe_open
    from transformers import AutoConfig, Qwen3VLMoeForConditionalGeneration

    path = tiny_model_path("qwen3_vl_moe")
    text = AutoConfig.from_pretrained(path).text_config
    hidden, inter, experts = text.hidden_size, text.moe_intermediate_size, text.num_experts
    assert 2 * inter != hidden  # gate_up_proj not square: a wrong orientation cannot go unnoticed by shape
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        saved = {name: f.get_tensor(name) for name in (GATE_UP, DOWN)}
    assert saved[GATE_UP].shape == (experts, hidden, 2 * inter) and saved[DOWN].shape == (experts, inter, hidden)
    model = Qwen3VLMoeForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16)
    state = model.state_dict()
    assert torch.equal(state[GATE_UP], saved[GATE_UP].transpose(1, 2))
    assert torch.equal(state[DOWN], saved[DOWN].transpose(1, 2))
    assert needs_transpose(GATE_UP, "qwen3_vl_moe") and not needs_transpose(GATE_UP, "qwen3_5_moe")


def test_the_hf_export_of_a_qwen3_vl_moe_actor_is_in_the_released_layout(tiny_model_path, tmp_path):
    """easyrl.models.hf_folder.write_hf_folder (what save_hf and the checkpoint converter write) from
    transformers-layout full weights: the folder holds the released layout, and transformers loads it back to the same
    weights."""
    from safetensors import safe_open
    from transformers import Qwen3VLMoeForConditionalGeneration

    from easyrl.models.hf_folder import write_hf_folder

    base = tiny_model_path("qwen3_vl_moe")
    state = Qwen3VLMoeForConditionalGeneration.from_pretrained(base, dtype=torch.float32).state_dict()
    state = {name: tensor + 0.5 if name in (GATE_UP, DOWN) else tensor for name, tensor in state.items()}  # "trained"
    out = write_hf_folder(state, [str(base)], str(tmp_path / "export"))
    with safe_open(str(tmp_path / "export" / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor(DOWN), state[DOWN].to(torch.bfloat16).transpose(1, 2))
    reloaded = Qwen3VLMoeForConditionalGeneration.from_pretrained(out, dtype=torch.float32).state_dict()
    assert torch.equal(reloaded[GATE_UP], state[GATE_UP].to(torch.bfloat16).float())


@pytest.mark.parametrize("model_type", ["mixtral"])
def test_renamed_families_reach_vllm_under_the_released_names(model_type, tmp_path):
    """A family whose modules transformers renames on load (``checkpoint_renames``: Mixtral's ``block_sparse_moe`` is
    ``mlp`` in memory) and whose experts vLLM takes one by one (``per_expert_names``) hands vLLM exactly the tensors
    transformers saves, by name and value."""
    from safetensors import safe_open

    from easyrl.models.families import FAMILIES
    from easyrl.testing.tiny_families import TINY_FAMILIES, tiny_family_config
    import transformers

    assert FAMILIES[model_type].checkpoint_renames and FAMILIES[model_type].per_expert_names
    config = tiny_family_config(model_type)
    config.update(dict(vocab_size=512, num_hidden_layers=1))
    model = getattr(transformers, TINY_FAMILIES[model_type].model_class)(config)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = {key: f.get_tensor(key) for key in f.keys()}
    synced = dict(to_checkpoint_layout(model.state_dict().items(), model_type))
    assert sorted(synced) == sorted(saved)
    for name, tensor in synced.items():
        assert torch.equal(tensor, saved[name]), name


def test_llava_onevision_tower_is_exported_and_synced_under_the_released_names(tmp_path):
    """transformers 5.19 holds and saves LLaVA-OneVision's SigLIP tower as ``vision_tower.*``; vLLM 0.32 loads only
    the released ``vision_tower.vision_model.*``: the export writes those names (and transformers loads them back to
    the same weights), and the weight sync hands them over."""
    from safetensors import safe_open
    from transformers import LlavaOnevisionForConditionalGeneration

    from easyrl.models.hf_folder import write_hf_folder
    from easyrl.testing.tiny_vl import build_tiny_vl

    base = build_tiny_vl("llava_onevision")
    state = LlavaOnevisionForConditionalGeneration.from_pretrained(base, dtype=torch.float32).state_dict()
    out = write_hf_folder(state, [str(base)], str(tmp_path / "export"), dtype=torch.float32)
    with safe_open(str(tmp_path / "export" / "model.safetensors"), "pt") as f:
        tower = [key for key in f.keys() if "vision_tower" in key]
    assert tower and all(".vision_tower.vision_model." in key for key in tower), tower[:3]
    synced = [name for name, _ in to_checkpoint_layout(state.items(), "llava_onevision") if "vision_tower" in name]
    assert synced and all(".vision_tower.vision_model." in name for name in synced), synced[:3]
    reloaded = LlavaOnevisionForConditionalGeneration.from_pretrained(out, dtype=torch.float32).state_dict()
    assert sorted(reloaded) == sorted(state)
    assert all(torch.equal(reloaded[name], tensor) for name, tensor in state.items())


def test_a_family_outside_the_registry_takes_transformers_released_layout():
    """DeepSeek-V3's released checkpoints hold one tensor per expert (transformers' conversion fuses
    ``mlp.experts.*.gate_proj/up_proj/down_proj``), and vLLM's DeepseekV2 loader takes only those names: the sync splits
    the fused tensors so. EXAONE-MoE's router bias is released outside ``mlp.gate`` (a renaming, reversed); gpt-oss
    is released fused and passes unchanged, as does a conversion of regular expressions (Kimi-Linear) and a listed
    family (its registry entry rules, and Mixtral's says what the conversion says)."""
    from easyrl.models.expert_layout import released_layout

    assert "deepseek_v3" not in FAMILIES and "exaone_moe" not in FAMILIES
    assert released_layout("deepseek_v3") == ((), ("gate_proj", "up_proj", "down_proj"))
    assert released_layout("gpt_oss") == released_layout("kimi_linear") == ((), ())
    assert released_layout("mixtral") == (FAMILIES["mixtral"].checkpoint_renames, FAMILIES["mixtral"].per_expert_names)
    gate_up, down = torch.randn(2, 6, 4), torch.randn(2, 4, 3)
    out = dict(to_checkpoint_layout([("model.layers.1.mlp.experts.gate_up_proj", gate_up),
                                     ("model.layers.1.mlp.experts.down_proj", down)], "deepseek_v3"))
    assert sorted(out) == [f"model.layers.1.mlp.experts.{e}.{n}_proj.weight" for e in (0, 1)
                           for n in ("down", "gate", "up")]
    assert torch.equal(out["model.layers.1.mlp.experts.1.gate_proj.weight"], gate_up[1, :3])
    assert torch.equal(out["model.layers.1.mlp.experts.1.up_proj.weight"], gate_up[1, 3:])
    assert torch.equal(out["model.layers.1.mlp.experts.0.down_proj.weight"], down[0])
    bias = torch.zeros(4)
    assert next(to_checkpoint_layout([("model.layers.1.mlp.gate.e_score_correction_bias", bias)], "exaone_moe")) == (
        "model.layers.1.mlp.e_score_correction_bias", bias)
    assert next(to_checkpoint_layout([(GATE_UP, gate_up)], "qwen3_moe"))[1] is gate_up
