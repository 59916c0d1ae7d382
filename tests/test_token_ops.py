"""Chunked log-prob / entropy against the straightforward formulas."""

import math

import pytest
import torch
import torch.nn.functional as F

from easyrl.algorithms.token_ops import entropy_from_logits, log_probs_from_logits


def _naive_log_probs(logits, labels):
    return F.log_softmax(logits.double(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _naive_entropy(logits):
    logp = F.log_softmax(logits.double(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _data(seed=0, shape=(3, 5, 11)):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, generator=g) * 3
    labels = torch.randint(0, shape[-1], shape[:-1], generator=g)
    return logits, labels


@pytest.mark.parametrize("chunk_rows", [1, 4, 15, 1000])  # 15 rows: chunks that do and do not divide it
def test_log_probs_match_log_softmax(chunk_rows):
    logits, labels = _data()
    out = log_probs_from_logits(logits, labels, chunk_rows=chunk_rows)
    assert out.shape == (3, 5) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _naive_log_probs(logits, labels), atol=1e-5, rtol=1e-5)


def test_log_probs_gradient_matches():
    logits, labels = _data(1)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().double().requires_grad_(True)
    weights = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    (log_probs_from_logits(a, labels, chunk_rows=4) * weights).sum().backward()
    (_naive_log_probs(b, labels) * weights.double()).sum().backward()
    torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=1e-5)


def test_sliced_logits_and_gradient():
    # logits[:, :-1] (the usual causal shift) is not viewable as 2-D: read block by block, gradient lands in place
    logits, _ = _data(5, shape=(3, 6, 11))
    labels = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(6))
    a = logits.clone().requires_grad_(True)
    b = logits.clone().double().requires_grad_(True)
    out = log_probs_from_logits(a[:, :-1], labels, chunk_rows=2)
    ref = _naive_log_probs(b[:, :-1], labels)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=1e-5)
    assert a.grad[:, -1].abs().sum() == 0


def test_temperature_matches_scaled_logits_with_gradient():
    logits, labels = _data(9)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().double().requires_grad_(True)
    w = torch.randn(3, 5, generator=torch.Generator().manual_seed(10))
    lp = log_probs_from_logits(a, labels, chunk_rows=4, temperature=0.7)
    ent = entropy_from_logits(a, chunk_rows=4, temperature=0.7)
    lp_ref = _naive_log_probs(b / 0.7, labels)
    ent_ref = _naive_entropy(b / 0.7)
    torch.testing.assert_close(lp.double(), lp_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ent_ref, atol=1e-5, rtol=1e-5)
    ((lp + ent) * w).sum().backward()
    ((lp_ref + ent_ref) * w.double()).sum().backward()
    torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=1e-5)


def test_log_probs_bf16_input():
    logits, labels = _data(3)
    bf16 = logits.bfloat16()
    out = log_probs_from_logits(bf16, labels, chunk_rows=4)
    assert out.dtype == torch.float32
    # computed in float32 from the bf16 values
    torch.testing.assert_close(out.double(), _naive_log_probs(bf16.float(), labels), atol=1e-5, rtol=1e-5)
    a = bf16.clone().requires_grad_(True)
    b = bf16.double().requires_grad_(True)
    log_probs_from_logits(a, labels, chunk_rows=4).sum().backward()
    _naive_log_probs(b, labels).sum().backward()
    assert a.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-2, rtol=1e-2)  # bf16 rounding of the gradient


def test_uniform_logits_hand_values():
    # vocab 7, all logits equal: log p = -ln 7 for any label, entropy = ln 7
    logits = torch.zeros(2, 3, 7)
    labels = torch.tensor([[0, 3, 6], [1, 1, 2]])
    torch.testing.assert_close(log_probs_from_logits(logits, labels), torch.full((2, 3), -math.log(7)))
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(7)))


def test_peaked_logits_entropy_near_zero():
    # p = (1, e^-50, e^-50) up to normalisation: H ~ 2 * 50 * e^-50 ~ 2e-20, i.e. 0 in float32
    logits = torch.tensor([[[50.0, 0.0, 0.0], [0.0, 0.0, 50.0]]])
    assert entropy_from_logits(logits).abs().max().item() < 1e-6


@pytest.mark.parametrize("chunk_rows", [1, 4, 1000])
def test_entropy_matches_formula_with_gradient(chunk_rows):
    logits, _ = _data(4)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().double().requires_grad_(True)
    out = entropy_from_logits(a, chunk_rows=chunk_rows)
    assert out.shape == (3, 5) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _naive_entropy(b), atol=1e-5, rtol=1e-5)
    weights = torch.randn(3, 5, generator=torch.Generator().manual_seed(7))
    (out * weights).sum().backward()
    (_naive_entropy(b) * weights.double()).sum().backward()
    torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=1e-5)


def test_bad_inputs_raise():
    logits, labels = _data()
    with pytest.raises(ValueError, match="labels shape"):
        log_probs_from_logits(logits, labels[:, :4])
    with pytest.raises(ValueError, match="vocab=11"):
        log_probs_from_logits(logits, torch.full_like(labels, 11))
    with pytest.raises(ValueError, match="logits"):
        entropy_from_logits(torch.zeros(5))
    with pytest.raises(ValueError, match="chunk_rows"):
        entropy_from_logits(logits, chunk_rows=0)
    with pytest.raises(ValueError, match="temperature"):
        log_probs_from_logits(logits, labels, temperature=0.0)


def test_no_grad_and_empty():
    logits, labels = _data()
    with torch.no_grad():
        assert log_probs_from_logits(logits, labels).shape == (3, 5)
    assert entropy_from_logits(torch.zeros(0, 4, 11)).shape == (0, 4)
    assert log_probs_from_logits(torch.zeros(2, 0, 11), torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)


@pytest.mark.parametrize("fn", ["log_probs", "entropy"])
def test_autograd_keeps_no_vocab_sized_float_copy(fn):
    # everything autograd saves for backward: must be the bf16 logits themselves (same storage) plus
    # per-position vectors, never a float32 (.., vocab) tensor
    logits, labels = _data(8, shape=(2, 8, 64))
    x = logits.bfloat16().requires_grad_(True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = log_probs_from_logits(x, labels, chunk_rows=4) if fn == "log_probs" else entropy_from_logits(x, 4)
    vocab_sized = [t for t in saved if t.numel() >= x.numel()]
    assert all(t.data_ptr() == x.data_ptr() and t.dtype == torch.bfloat16 for t in vocab_sized)
    assert sum(t.numel() for t in saved if t.data_ptr() != x.data_ptr()) <= 2 * 16  # one value per position
    out.sum().backward()
