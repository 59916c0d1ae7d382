"""The critic's value head on the real backbone classes (no process group needed): shape, zero start, untied."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from easyrl.models.hf_folder import hf_model_class
from easyrl.workers.critic import attach_value_head


@pytest.mark.parametrize("arch", ["qwen2_5", "qwen2_5_vl"])
def test_value_head_replaces_the_lm_head_and_starts_at_zero(tiny_model_path, arch):
    config = AutoConfig.from_pretrained(tiny_model_path(arch))
    model = hf_model_class(config).from_config(config)
    embeddings = model.get_input_embeddings().weight.detach().clone()
    attach_value_head(model)
    head = model.get_output_embeddings()
    assert tuple(head.weight.shape) == (1, config.get_text_config().hidden_size) and head.bias is not None
    ids = torch.randint(10, 1000, (2, 7))
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=4).logits
    assert tuple(out.shape) == (2, 4, 1) and out.abs().max().item() == 0.0
    # one gradient step on the value head leaves the word embeddings alone (they are not tied to it)
    out.sum().backward()
    assert head.weight.grad.abs().sum() > 0
    torch.testing.assert_close(model.get_input_embeddings().weight.detach(), embeddings)
    assert model.get_input_embeddings().weight is not head.weight


def test_value_head_on_meta_stays_on_meta(tiny_model_path):
    config = AutoConfig.from_pretrained(tiny_model_path("qwen2_5"))
    with torch.device("meta"):
        model = hf_model_class(config).from_config(config)
    attach_value_head(model)
    assert model.get_output_embeddings().weight.is_meta

