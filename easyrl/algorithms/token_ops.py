"""Per-token log-probabilities and entropies from logits, without vocabulary-sized float32 copies.

Both are ``autograd.Function``s that walk the positions in chunks of ``chunk_rows``: only a ``(chunk_rows, vocab)``
float32 temporary exists at a time, backward keeps a reference to the logits (no copy) and recomputes each chunk's
softmax (``d log p(y) / dz = onehot(y) - p``; ``dH / dz = -p * (log p + H)``). Pass the raw (bf16) logits slice and
``temperature``, not ``logits.float() / temperature`` (a full float32 copy). Results are float32; no double backward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.autograd.function import once_differentiable

__all__ = ["log_probs_from_logits", "entropy_from_logits"]

DEFAULT_CHUNK_ROWS = 256


def _blocks(x: torch.Tensor, chunk_rows: int, offset: int = 0) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(start, stop, block)`` over the flattened rows of ``x`` ``(..., vocab)``, ``block`` a view, no copy."""
    vocab = x.shape[-1]
    try:
        flat = x.view(-1, vocab)
    except RuntimeError:  # not viewable as 2-D (e.g. a slice along a middle dim): descend into dim 0
        rows_per_item = x[0].numel() // vocab if x.shape[0] else 0
        for i in range(x.shape[0]):
            yield from _blocks(x[i], chunk_rows, offset + i * rows_per_item)
        return
    for start in range(0, flat.shape[0], chunk_rows):
        block = flat[start : start + chunk_rows]
        yield offset + start, offset + start + block.shape[0], block


def _chunked_backward(ctx, grad_out: torch.Tensor,
                      chunk_grad: Callable[[torch.Tensor, slice, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The gradient w.r.t. the saved logits, in their dtype, chunk by chunk: ``chunk_grad(z, rows, g)`` gets the
    chunk's float32 ``logits / T``, its row slice and the ``(rows, 1)`` incoming gradient divided by ``T``."""
    logits = ctx.saved_tensors[0]
    grad_flat = grad_out.reshape(-1, 1).float() / ctx.temperature
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    grad_rows = grad.view(-1, logits.shape[-1])
    for start, stop, block in _blocks(logits, ctx.chunk_rows):
        grad_rows[start:stop] = chunk_grad(block.float() / ctx.temperature, slice(start, stop), grad_flat[start:stop])
    return grad


class _LabelLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int, temperature: float) -> torch.Tensor:
        flat_labels = labels.reshape(-1, 1)
        out = torch.empty(flat_labels.shape[0], dtype=torch.float32, device=logits.device)
        for start, stop, block in _blocks(logits, chunk_rows):
            z = block.float() / temperature
            out[start:stop] = z.gather(-1, flat_labels[start:stop]).squeeze(-1) - torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(logits, flat_labels)
        ctx.chunk_rows, ctx.temperature = chunk_rows, temperature
        return out.view(labels.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        flat_labels = ctx.saved_tensors[1]

        def chunk_grad(z: torch.Tensor, rows: slice, g: torch.Tensor) -> torch.Tensor:
            # d log p(y) / dz = onehot(y) - p
            return torch.softmax(z, dim=-1).mul_(-g).scatter_add_(-1, flat_labels[rows], g)

        return _chunked_backward(ctx, grad_out, chunk_grad), None, None, None


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, chunk_rows: int, temperature: float) -> torch.Tensor:
        out = torch.empty(logits.numel() // logits.shape[-1], dtype=torch.float32, device=logits.device)
        for start, stop, block in _blocks(logits, chunk_rows):
            logp = torch.log_softmax(block.float() / temperature, dim=-1)
            out[start:stop] = -(logp.exp() * logp).sum(dim=-1)
        ctx.save_for_backward(logits, out)
        ctx.chunk_rows, ctx.temperature = chunk_rows, temperature
        return out.view(logits.shape[:-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        entropy = ctx.saved_tensors[1]

        def chunk_grad(z: torch.Tensor, rows: slice, g: torch.Tensor) -> torch.Tensor:
            # dH/dz_j = -p_j (log p_j + H)
            logp = torch.log_softmax(z, dim=-1)
            return logp.exp().mul_(logp.add_(entropy[rows].unsqueeze(-1))).mul_(-g)

        return _chunked_backward(ctx, grad_out, chunk_grad), None, None


def _check_logits(logits: torch.Tensor, chunk_rows: int, temperature: float) -> None:
    if logits.dim() < 2:
        raise ValueError(f"logits must be (..., vocab) with at least 2 dims, got shape {tuple(logits.shape)}")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                          temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits.float() / temperature, -1).gather(-1, labels)`` (nats): ``(bsz, L)`` float32 for
    ``(bsz, L, vocab)`` logits (any leading dims) and ``(bsz, L)`` labels; the gradient in the logits' dtype.
    ValueError for mismatched shapes, a label outside ``[0, vocab)``, ``chunk_rows < 1`` or ``temperature <= 0``."""
    _check_logits(logits, chunk_rows, temperature)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape without vocab {tuple(logits.shape[:-1])}"
        )
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= logits.shape[-1]):
        raise ValueError(f"labels must lie in [0, vocab={logits.shape[-1]}); got ids outside that range")
    return _LabelLogProb.apply(logits, labels.long(), chunk_rows, float(temperature))


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int = DEFAULT_CHUNK_ROWS, temperature: float = 1.0
                        ) -> torch.Tensor:
    """``H = -sum_v p_v log p_v`` (nats) of ``softmax(logits / temperature)``, ``(bsz, L)`` float32; ValueError for
    fewer than 2 dims, ``chunk_rows < 1`` or ``temperature <= 0``."""
    _check_logits(logits, chunk_rows, temperature)
    return _Entropy.apply(logits, chunk_rows, float(temperature))
