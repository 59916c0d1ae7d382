"""LoRA (easyrl.models.lora): the merge by hand, the FSDP2 actor with peft's layers (only the adapter trains; the
adapter switched off is the base model; the merged weights compute what the LoRA model computes), and the exported
adapter loads in peft and merges to the same weights."""

from __future__ import annotations

import os

import pytest
import torch

from easyrl.config import ActorConfig, LoraConfig, OffloadConfig
from easyrl.models.lora import (
    adapter_disabled,
    is_adapter_key,
    lora_scale,
    merge_lora_stream,
    save_adapter,
    target_modules,
)
from easyrl.models.hf_folder import hf_model_class
from easyrl.workers.fsdp_model import gather_full, load_sharded_model


def test_merge_by_hand_in_any_order_with_bias_renamed_and_other_names_passed_through():
    w = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]])  # (out=2, in=3)
    a = torch.tensor([[1.0, 2.0, 3.0]])  # (rank=1, in=3)
    b = torch.tensor([[1.0], [-1.0]])  # (out=2, rank=1)
    stream = [
        ("model.norm.weight", torch.ones(2)),
        ("layer.q.lora_B.default.weight", b),
        ("layer.q.base_layer.bias", torch.tensor([5.0, 6.0])),
        ("layer.q.lora_A.default.weight", a),
        ("layer.q.base_layer.weight", w),
    ]
    merged = dict(merge_lora_stream(iter(stream), scale=2.0))
    # W + 2 * B @ A: B @ A = [[1, 2, 3], [-1, -2, -3]]
    assert torch.equal(merged["layer.q.weight"], torch.tensor([[3.0, 4.0, 8.0], [-2.0, -3.0, -6.0]]))
    assert torch.equal(merged["layer.q.bias"], torch.tensor([5.0, 6.0]))
    assert torch.equal(merged["model.norm.weight"], torch.ones(2))
    assert sorted(merged) == ["layer.q.bias", "layer.q.weight", "model.norm.weight"]


def test_merge_refuses_a_base_weight_without_its_matrices():
    with pytest.raises(ValueError, match="layer.q"):
        list(merge_lora_stream(iter([("layer.q.base_layer.weight", torch.ones(2, 2)),
                                     ("layer.q.lora_A.default.weight", torch.ones(1, 2))]), 1.0))


def test_target_modules_string():
    assert target_modules(" all-linear ") == "all-linear"
    assert target_modules("q_proj, v_proj,") == ["q_proj", "v_proj"]


def _lora_actor(tiny_model_path, rank=4, alpha=8.0, targets="all-linear"):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoConfig

    path = tiny_model_path("qwen2_5")
    hf_config = AutoConfig.from_pretrained(path)
    config = ActorConfig()
    config.model.model_path = str(path)
    config.model.lora = LoraConfig(rank=rank, alpha=alpha, target_modules=targets)
    config.fsdp.param_dtype = "fp32"
    config.fsdp.enable_gradient_checkpointing = False
    mesh = init_device_mesh("cpu", (1,))
    model = load_sharded_model(str(path), hf_config, config, mesh, "cpu", True, OffloadConfig())
    return path, hf_config, config, model


def test_lora_actor_trains_only_the_adapter_and_merges_to_what_it_computes(process_group, tiny_model_path, tmp_path):
    from peft import PeftModel

    path, hf_config, config, model = _lora_actor(tiny_model_path)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    assert trainable and all(is_adapter_key(name) for name in trainable)
    assert len(trainable) == 2 * 7 * hf_config.num_hidden_layers  # A and B of q,k,v,o,gate,up,down per layer
    assert frozen and not any(is_adapter_key(name) for name in frozen)

    # give the adapter a non-zero B (peft starts it at 0), as after some training
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.to_local().copy_(torch.randn(p.to_local().shape) * 0.05)  # one rank: the whole tensor
    ids = torch.tensor([[151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30]])
    model.eval()
    with torch.no_grad():
        lora_logits = model(input_ids=ids).logits
        with adapter_disabled(model):
            base_logits = model(input_ids=ids).logits
    assert (lora_logits - base_logits).abs().max() > 1e-3  # the adapter changes the output ...
    assert all(p.requires_grad for n, p in model.named_parameters() if is_adapter_key(n))  # ... and is trainable again

    base = hf_model_class(hf_config).from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(base(input_ids=ids).logits, base_logits, atol=1e-5)  # adapter off = the checkpoint
    state = {k: gather_full(v, torch.device("cpu")) for k, v in model.state_dict().items()}
    merged = dict(merge_lora_stream(state.items(), lora_scale(config.model.lora)))
    assert merged.keys() == base.state_dict().keys()
    plain = hf_model_class(hf_config).from_pretrained(path, dtype=torch.float32)
    plain.load_state_dict(merged)
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, lora_logits, atol=1e-4)  # merged = base + adapter

    # the adapter in peft's format: peft loads it onto the base and merges to the same weights
    out = save_adapter(state, config.model.lora, str(path), str(tmp_path / "adapter"))
    assert os.stat(os.path.join(out, "adapter_model.safetensors")).st_mode & 0o044  # not safetensors' 0600
    peft_merged = PeftModel.from_pretrained(base, out).merge_and_unload().state_dict()
    for name, value in merged.items():
        assert torch.allclose(peft_merged[name], value, atol=1e-6), name


def test_target_modules_that_match_nothing_is_a_model_error(process_group, tiny_model_path):
    from easyrl.errors import ModelError

    with pytest.raises(ModelError, match="worker.actor.model.lora.target_modules='nope_proj'"):
        _lora_actor(tiny_model_path, targets="nope_proj")
