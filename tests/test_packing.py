"""Padding-free forwards: packing layout, and packed vs padded log-probs/gradients on tiny real models (fp32, SDPA)."""

from __future__ import annotations

import pytest
import torch

from easyrl.algorithms.token_ops import log_probs_from_logits
from easyrl.models.packing import pack_sequences, padded_text_positions

# measured: max |packed - padded| log-prob 9.5e-7 (text, Qwen2.5-VL, Qwen3-VL; fp32, SDPA)
ATOL = 1e-5


def _padded_rows(prompts: list[list[int]], responses: list[list[int]], prompt_len: int, resp_len: int, pad: int = 0):
    """The trainer's layout: left-padded prompts, right-padded responses."""
    bsz = len(prompts)
    ids = torch.full((bsz, prompt_len + resp_len), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, prompt_len - len(p): prompt_len] = torch.tensor(p)
        mask[i, prompt_len - len(p): prompt_len] = 1
        ids[i, prompt_len: prompt_len + len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, prompt_len: prompt_len + len(r)] = 1
    return ids, mask, mask[:, prompt_len:].clone()


def test_pack_layout_positions_and_scatter():
    ids, mask, resp_mask = _padded_rows([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], prompt_len=4, resp_len=3)
    packed = pack_sequences(ids, mask, resp_mask)
    assert packed.input_ids.tolist() == [[5, 6, 7, 9, 10, 8, 11, 12, 13]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert packed.cu_seqlens.tolist() == [0, 5, 9] and packed.max_seqlen == 5
    # response token 9 is predicted at packed position 2 (token 7), 11 at position 5 (token 8)
    assert packed.logit_indices.tolist() == [2, 3, 5, 6, 7]
    assert packed.labels.tolist() == [9, 10, 11, 12, 13]
    values = torch.arange(1.0, 6.0, requires_grad=True)
    out = packed.unpack(values)
    assert out.tolist() == [[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]]
    out.sum().backward()
    assert values.grad.tolist() == [1.0] * 5


def test_pack_rejects_bad_rows():
    ids, mask, resp_mask = _padded_rows([[], [8]], [[9], [11]], prompt_len=2, resp_len=1)
    with pytest.raises(ValueError, match="row 0"):
        pack_sequences(ids, mask, resp_mask)
    ids, mask, resp_mask = _padded_rows([[5], [8]], [[9], [11]], prompt_len=2, resp_len=1)
    with pytest.raises(ValueError, match="positions must be"):
        pack_sequences(ids, mask, resp_mask, positions=torch.zeros(3, 2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="unpack got 1 values"):
        pack_sequences(ids, mask, resp_mask).unpack(torch.zeros(1))


def _load(path):
    from transformers import AutoConfig

    from easyrl.models.hf_folder import hf_model_class

    config = AutoConfig.from_pretrained(path)
    model = hf_model_class(config).from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.no_grad():  # the tiny models' random init is near uniform: make log-probs and gradients informative
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def _text_batch(vocab_hi: int = 5000):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, vocab_hi, (n,), generator=g).tolist() for n in (7, 3, 11)]
    responses = [torch.randint(10, vocab_hi, (n,), generator=g).tolist() for n in (5, 9, 1)]
    return _padded_rows(prompts, responses, prompt_len=12, resp_len=9)


def _padded_log_probs(model, ids, mask, resp_mask, **extra):
    resp_len = resp_mask.shape[1]
    if "pixel_values" not in extra:
        extra["position_ids"] = padded_text_positions(mask)
    out = model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=resp_len + 1, **extra)
    logits = out.logits[:, :-1]
    return log_probs_from_logits(logits, ids[:, -resp_len:]) * resp_mask


def _packed_log_probs(model, ids, mask, resp_mask, positions=None, mrope=False, **extra):
    packed = pack_sequences(ids, mask, resp_mask, positions, mrope=mrope)
    logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                   use_cache=False, logits_to_keep=packed.logit_indices, **extra).logits[0]
    return packed.unpack(log_probs_from_logits(logits, packed.labels))


def _compare(model, padded_fn, packed_fn):
    weights = torch.randn(3, 9, generator=torch.Generator().manual_seed(1))
    grads = []
    outs = []
    for fn in (padded_fn, packed_fn):
        model.zero_grad(set_to_none=True)
        out = fn()
        (out * weights).sum().backward()
        outs.append(out.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(outs[1], outs[0], atol=ATOL, rtol=0)
    assert outs[0].abs().sum() > 1.0  # real log-probs, not zeros
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)
    return (outs[1] - outs[0]).abs().max().item()


def test_packed_forward_matches_padded_text(tiny_model_path):
    model = _load(tiny_model_path("qwen2_5"))
    ids, mask, resp_mask = _text_batch()
    _compare(model, lambda: _padded_log_probs(model, ids, mask, resp_mask),
             lambda: _packed_log_probs(model, ids, mask, resp_mask))


def test_packed_positions_must_restart_per_sequence(tiny_model_path):
    """The guard: one running position over the packed row (no per-sequence restart) leaks attention across
    sequences and changes the log-probs of every sequence after the first."""
    model = _load(tiny_model_path("qwen2_5"))
    ids, mask, resp_mask = _text_batch()
    with torch.no_grad():
        padded = _padded_log_probs(model, ids, mask, resp_mask)
        packed = pack_sequences(ids, mask, resp_mask)
        running = torch.arange(packed.num_tokens).unsqueeze(0)
        logits = model(input_ids=packed.input_ids, position_ids=running, use_cache=False,
                       logits_to_keep=packed.logit_indices).logits[0]
        wrong = packed.unpack(log_probs_from_logits(logits, packed.labels))
    assert (wrong[1:] - padded[1:]).abs().max() > 1e-2


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_packed_forward_matches_padded_vl(tiny_model_path, arch):
    from PIL import Image
    from transformers import AutoProcessor

    path = tiny_model_path(arch)
    model = _load(path)
    processor = AutoProcessor.from_pretrained(path)
    images = [Image.new("RGB", (56, 84), (200, 30, 60)), Image.new("RGB", (112, 56), (10, 220, 90))]
    texts = ["<|vision_start|><|image_pad|><|vision_end|>what is x?", "hi there, no image",
             "a<|vision_start|><|image_pad|><|vision_end|>find y"]
    rows, pixel_values, grids = [], [], []
    image_iter = iter(images)
    for text in texts:
        imgs = [next(image_iter)] if "image_pad" in text else None
        out = processor(text=[text], images=imgs, return_tensors="pt")
        rows.append(out["input_ids"][0].tolist())
        if imgs:
            pixel_values.append(out["pixel_values"])
            grids.append(out["image_grid_thw"])
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(10, 5000, (n,), generator=g).tolist() for n in (5, 9, 1)]
    prompt_len = max(map(len, rows)) + 2
    ids, mask, resp_mask = _padded_rows(rows, responses, prompt_len=prompt_len, resp_len=9)
    mm = {"pixel_values": torch.cat(pixel_values), "image_grid_thw": torch.cat(grids)}
    types = torch.zeros_like(ids)
    types[:, :prompt_len][ids[:, :prompt_len] == model.config.image_token_id] = 1
    positions, _ = model.model.get_rope_index(ids, types, image_grid_thw=mm["image_grid_thw"], attention_mask=mask)
    max_diff = _compare(model, lambda: _padded_log_probs(model, ids, mask, resp_mask, mm_token_type_ids=types, **mm),
                        lambda: _packed_log_probs(model, ids, mask, resp_mask, positions, **mm))
    assert max_diff < ATOL


def test_packed_text_only_rows_on_a_vl_model(tiny_model_path):
    """A micro-batch without images on Qwen-VL: the mRoPE form (4, 1, tokens) of the text positions is what makes the
    model build the packed mask (from 2-D position ids it builds none and the rows attend to each other)."""
    model = _load(tiny_model_path("qwen2_5_vl"))
    ids, mask, resp_mask = _text_batch()
    _compare(model, lambda: _padded_log_probs(model, ids, mask, resp_mask),
             lambda: _packed_log_probs(model, ids, mask, resp_mask, mrope=True))
    with torch.no_grad():
        wrong = _packed_log_probs(model, ids, mask, resp_mask, mrope=False)
        assert (wrong - _padded_log_probs(model, ids, mask, resp_mask)).abs().max() > 1e-2
