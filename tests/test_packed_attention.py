"""The per-sequence attention of packed rows (``easyrl.models.packed_attention``) against transformers' ``sdpa`` with
its block-diagonal mask and against padded forwards: same outputs and gradients (fp32), padded batches unchanged."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from easyrl.models.packed_attention import PACKED_SDPA, packed_sdpa_attention, sequence_lengths
from easyrl.models.packing import padded_text_positions

# measured on this CPU (fp32): outputs max |diff| ~1e-7 (attention) / ~1e-6 (a 2-layer model's logits)
ATOL = 1e-5
LENGTHS = (7, 3, 12, 1, 9)


def test_sequence_lengths_of_3d_mrope_positions_start_where_all_rows_are_zero():
    """GLM-4.5V hands its layers the 3-D mRoPE rows: a 2x2 image's rows repeat (t) and jump (h, w) inside a sequence,
    which the +1 rule would split; each sequence starts at (0, 0, 0)."""
    t = [0, 1, 1, 1, 1, 3, 4, 0, 1, 2]  # a text token, the image (t=1, h and w 1..2), two text tokens; then 3 tokens
    h = [0, 1, 1, 2, 2, 3, 4, 0, 1, 2]
    w = [0, 1, 2, 1, 2, 3, 4, 0, 1, 2]
    assert sequence_lengths(torch.tensor([t, h, w])[:, None]) == [7, 3]


def test_sequence_lengths_follow_transformers_rule():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 0]])
    assert sequence_lengths(positions) == [3, 2, 4, 1]
    assert sequence_lengths(torch.arange(6)) == [6]
    assert sequence_lengths(torch.tensor([5, 6, 7, 2, 3])) == [3, 2]  # a restart need not be at 0


class _Attention(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 2


def _positions(lengths) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)


def _block_causal_mask(lengths) -> torch.Tensor:
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    causal = torch.ones(len(seq), len(seq), dtype=torch.bool).tril()
    return (causal & (seq[:, None] == seq[None, :]))[None, None]


def test_attention_matches_masked_sdpa_with_gqa_and_gradients():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    total = sum(LENGTHS)
    g = torch.Generator().manual_seed(0)
    q0 = torch.randn(1, 4, total, 16, generator=g)
    k0, v0 = torch.randn(1, 2, total, 16, generator=g), torch.randn(1, 2, total, 16, generator=g)
    module = _Attention()
    outs, grads = [], []
    for packed in (True, False):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        if packed:
            out, _ = packed_sdpa_attention(module, q, k, v, None, scaling=0.25, position_ids=_positions(LENGTHS))
        else:
            out, _ = sdpa_attention_forward(module, q, k, v, _block_causal_mask(LENGTHS), scaling=0.25)
        out.pow(2).sum().backward()
        outs.append(out.detach())
        grads.append([t.grad for t in (q, k, v)])
    assert outs[0].shape == (1, total, 4, 16)
    torch.testing.assert_close(outs[0], outs[1], atol=ATOL, rtol=0)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_sliding_window_layers_get_their_band_per_sequence():
    """A sliding-window layer (Gemma 3's local layers, Mistral) sees the last ``window`` keys of its own sequence,
    as transformers' masked sdpa with the block-causal mask narrowed to the window."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    lengths, window = (4, 9, 6), 3
    q = torch.randn(1, 4, sum(lengths), 16, generator=torch.Generator().manual_seed(1))
    kv = torch.randn(1, 2, sum(lengths), 16, generator=torch.Generator().manual_seed(2))
    positions = _positions(lengths)
    band = (positions[0][:, None] - positions[0][None, :]) < window
    out, _ = packed_sdpa_attention(_Attention(), q, kv, kv, None, position_ids=positions, sliding_window=window)
    ref, _ = sdpa_attention_forward(_Attention(), q, kv, kv, _block_causal_mask(lengths) & band)
    full, _ = packed_sdpa_attention(_Attention(), q, kv, kv, None, position_ids=positions)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    assert (out - full).abs().max() > 1e-2  # the window masks something


def _models():
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    reference = Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    packed = Qwen2ForCausalLM._from_config(config, attn_implementation=PACKED_SDPA).eval()
    packed.load_state_dict(reference.state_dict())
    return reference, packed


def test_model_packed_row_matches_padded_batch_and_padded_batch_is_unchanged():
    reference, packed = _models()
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, 64, (n,), generator=g) for n in LENGTHS]
    width = max(LENGTHS)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):  # left padding, as the trainer's prompts: only the mask keeps it out
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = 1
    positions = padded_text_positions(mask)
    with torch.no_grad():
        padded_ref = reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        padded_packed_model = packed(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        row = packed(input_ids=torch.cat(rows)[None], position_ids=_positions(LENGTHS)).logits[0]
    valid = mask.bool()
    torch.testing.assert_close(row, padded_ref[valid], atol=ATOL, rtol=0)
    torch.testing.assert_close(padded_packed_model[valid], padded_ref[valid], atol=ATOL, rtol=0)


def test_qwen3_5_packed_row_in_one_varlen_call_matches_one_call_per_sequence(tiny_model_path, monkeypatch):
    """With flash-linear-attention and causal-conv1d installed, Gated DeltaNet takes a packed row in one call with its
    boundaries (``cu_seqlens``, ``seq_idx``). Stand-ins that honour them as the kernels document (transformers' PyTorch
    code per sequence) give the logits of the one-call-per-sequence split."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5

    from easyrl.models import packed_linear_attention

    conv, rule, calls = qwen3_5.causal_conv1d_fn, qwen3_5.torch_chunk_gated_delta_rule, []

    def varlen_conv(x, weight, bias=None, activation=None, seq_idx=None, **kwargs):  # x: (1, channels, tokens)
        calls.append(seq_idx[0].tolist())
        pieces = x.split(torch.bincount(seq_idx[0]).tolist(), dim=-1)
        return torch.cat([conv(p, weight, bias, activation=activation) for p in pieces], dim=-1)

    def varlen_rule(q, k, v, g, beta, cu_seqlens=None, **kwargs):  # (1, tokens, heads, ...)
        lengths = cu_seqlens.diff().tolist()
        per_sequence = zip(*(t.split(lengths, dim=1) for t in (q, k, v, g, beta)))
        return torch.cat([rule(*parts, **kwargs)[0] for parts in per_sequence], dim=1), None

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_path("qwen3_5"), dtype=torch.float32).eval()
    assert packed_linear_attention.split_linear_attention_at_sequences(model) == 1
    lengths = (5, 7, 4)
    ids = torch.randint(100, 5000, (1, sum(lengths)), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        split = model(input_ids=ids, position_ids=_positions(lengths), use_cache=False).logits
        monkeypatch.setattr(packed_linear_attention, "varlen_kernels", lambda: True)
        monkeypatch.setattr(qwen3_5, "causal_conv1d_fn", varlen_conv)
        monkeypatch.setattr(qwen3_5, "torch_chunk_gated_delta_rule", varlen_rule)
        varlen = model(input_ids=ids, position_ids=_positions(lengths), use_cache=False).logits
    assert calls == [[0] * 5 + [1] * 7 + [2] * 4]  # one call for the row, each token's sequence index
    torch.testing.assert_close(varlen, split, atol=ATOL, rtol=0)


def _llama4(gradient_checkpointing: bool = False):
    """A tiny Llama 4 text model: three chunked-attention layers (chunks of 4 tokens) then a full NoPE one, whose
    decoder layers do not pass ``position_ids`` on to their attention (transformers 5.19)."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    from easyrl.models.packed_attention import carry_positions

    config = Llama4TextConfig(vocab_size=64, hidden_size=64, intermediate_size=32, intermediate_size_mlp=128,
                              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              num_local_experts=2, num_experts_per_tok=1, attention_chunk_size=4)
    torch.manual_seed(0)
    reference = Llama4ForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    packed = Llama4ForCausalLM._from_config(config, attn_implementation=PACKED_SDPA).eval()
    packed.load_state_dict(reference.state_dict())
    carry_positions(packed)
    if gradient_checkpointing:
        packed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        packed.train()  # checkpointing recomputes only in training mode (dropout is 0)
    return reference, packed


def test_llama4_packed_row_keeps_its_chunks_and_boundaries_per_sequence():
    """Llama 4's layers hand their attention no positions (:func:`carry_positions` brings the layer's own) and its
    chunked layers see only their 4-token block of their own sequence: a packed row scores as the left-padded batch
    (transformers' chunked mask counts the chunks past the padding), within 1e-5 (was 0.6-2.6 nats off)."""
    reference, packed = _llama4()
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, 64, (n,), generator=g) for n in LENGTHS]
    width = max(LENGTHS)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = 1
    with torch.no_grad():
        padded = reference(input_ids=ids, attention_mask=mask, position_ids=padded_text_positions(mask)).logits
        row = packed(input_ids=torch.cat(rows)[None], position_ids=_positions(LENGTHS)).logits[0]
    torch.testing.assert_close(row, padded[mask.bool()], atol=ATOL, rtol=0)


def test_llama4_packed_gradients_survive_gradient_checkpointing():
    """The backward recomputes each checkpointed layer outside the forward: its attention must see the sequence
    boundaries again (the layer's hooks run on the recomputation too), so the gradients equal those without
    checkpointing."""
    ids = torch.randint(1, 64, (1, sum(LENGTHS)), generator=torch.Generator().manual_seed(2))
    positions = _positions(LENGTHS)
    grads = []
    for checkpointing in (False, True):
        _, packed = _llama4(gradient_checkpointing=checkpointing)
        packed(input_ids=ids, position_ids=positions).logits.pow(2).mean().backward()
        grads.append(packed.model.embed_tokens.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=ATOL, rtol=0)
