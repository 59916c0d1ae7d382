"""The fused lm_head + log-softmax against the plain matmul + log_softmax (values and both gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from easyrl.models.fused_head import FusedLogProbHead, linear_log_probs


def _data(tokens=37, hidden=16, vocab=101, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64) * 0.5
    labels = torch.randint(0, vocab, (tokens,), generator=g)
    return h, w, labels


def _naive(h, w, labels, temperature):
    logp = F.log_softmax((h @ w.t()) / temperature, dim=-1)
    return logp.gather(-1, labels[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk", [1, 8, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match(chunk, temperature):
    h, w, labels = _data()
    a_h, a_w = h.float().requires_grad_(True), w.float().requires_grad_(True)
    b_h, b_w = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    lp, ent = linear_log_probs(a_h, a_w, labels, temperature, chunk_tokens=chunk)
    ref_lp, ref_ent = _naive(b_h, b_w, labels, temperature)
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=1e-5)
    g = torch.Generator().manual_seed(3)
    u, v = torch.randn(len(labels), generator=g, dtype=torch.float64), torch.randn(len(labels), generator=g,
                                                                                   dtype=torch.float64)
    ((lp.double() * u).sum() + (ent.double() * v).sum()).backward()
    ((ref_lp * u).sum() + (ref_ent * v).sum()).backward()
    torch.testing.assert_close(a_h.grad.double(), b_h.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a_w.grad.double(), b_w.grad, atol=1e-4, rtol=1e-4)


def test_bf16_weight_gradient_is_one_bf16_gemm_per_chunk_and_as_close_as_the_plain_heads():
    """The dW GEMM runs in the compute dtype (bf16 tensor cores on CUDA, not fp32), summed over chunks in fp32: its
    error against fp64 stays within the plain bf16 head's (whose autograd also runs dW in bf16)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    h, w, labels = _data(tokens=96, hidden=32, vocab=301)
    u = torch.randn(len(labels), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    gemms = []

    class RecordGemms(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.addmm_.default):
                gemms.append((tuple(args[-2].shape), tuple(args[-1].shape), args[-1].dtype))
            return func(*args, **(kwargs or {}))

    a_w = w.bfloat16().requires_grad_(True)
    lp, _ = linear_log_probs(h.bfloat16(), a_w, labels, chunk_tokens=32, entropy_grad=False)
    with RecordGemms():
        (lp.double() * u).sum().backward()
    dw_gemms = [dtype for a, b, dtype in gemms if a == (w.shape[0], 32) and b == (32, w.shape[1])]  # (V,c)(c,H)
    assert dw_gemms == [torch.bfloat16] * 3, gemms
    b_w = w.bfloat16().requires_grad_(True)
    (_naive(h.bfloat16(), b_w, labels, 1.0)[0].double() * u).sum().backward()
    ref_w = w.clone().requires_grad_(True)
    (_naive(h, ref_w, labels, 1.0)[0] * u).sum().backward()
    fused_err = (a_w.grad.double() - ref_w.grad).abs().max()
    plain_err = (b_w.grad.double() - ref_w.grad).abs().max()
    assert a_w.grad.dtype == torch.bfloat16 and fused_err <= max(plain_err, 1e-2 * ref_w.grad.abs().max())


def test_no_entropy_gradient_when_not_asked():
    h, w, labels = _data()
    a_w = w.float().requires_grad_(True)
    lp, ent = linear_log_probs(h.float(), a_w, labels, entropy_grad=False)
    assert not ent.requires_grad
    lp.sum().backward()
    b_w = w.clone().requires_grad_(True)
    _naive(h, b_w, labels, 1.0)[0].sum().backward()
    torch.testing.assert_close(a_w.grad.double(), b_w.grad, atol=1e-4, rtol=1e-4)


def test_hooks_turn_a_model_head_into_log_probs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50, bias=False))
    model.get_output_embeddings = lambda: model[1]
    head = FusedLogProbHead(model, chunk_tokens=3)
    ids = torch.randint(0, 50, (1, 7))
    labels = torch.randint(0, 50, (7,))
    plain = model(ids)  # inactive outside scoring: ordinary logits
    assert plain.shape == (1, 7, 50)
    with head.scoring(labels, temperature=1.0):
        out = model(ids)
    assert out.shape == (1, 7, 2)
    ref = F.log_softmax(plain[0], -1).gather(-1, labels[:, None]).squeeze(-1)
    torch.testing.assert_close(out[0, :, 0], ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one index per label"), head.scoring(labels[:3], temperature=1.0):
        model(ids)


def test_kept_positions_are_taken_where_the_model_ignores_logits_to_keep():
    """A forward that runs its head on every position (MiniCPM-V 4.6 drops ``logits_to_keep``): with ``keep`` the
    head scores the labels at those positions only."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50, bias=False))
    model.get_output_embeddings = lambda: model[1]
    head = FusedLogProbHead(model)
    ids, keep = torch.randint(0, 50, (1, 7)), torch.tensor([1, 2, 5])
    labels = torch.randint(0, 50, (3,))
    ref = F.log_softmax(model(ids)[0, keep], -1).gather(-1, labels[:, None]).squeeze(-1)
    with head.scoring(labels, temperature=1.0, keep=keep):
        out = model(ids)
    assert out.shape == (1, 3, 2)
    torch.testing.assert_close(out[0, :, 0], ref, atol=1e-5, rtol=1e-5)


def test_rejects_bad_shapes():
    h, w, labels = _data()
    with pytest.raises(ValueError, match="labels"):
        linear_log_probs(h, w, labels[:-1])
    with pytest.raises(ValueError, match="temperature"):
        linear_log_probs(h, w, labels, temperature=0.0)
