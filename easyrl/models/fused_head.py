"""Log-probs and entropies straight from the last hidden states: the lm_head matmul fused with the log-softmax.

:func:`linear_log_probs` never materialises ``(tokens, vocab)`` logits: per chunk of tokens it computes
``hidden_c @ W^T``, the label log-prob and the entropy, keeping one logsumexp and one entropy per token; backward
recomputes each chunk's logits (the trade of Liger-Kernel's fused linear cross-entropy, in plain torch).
:class:`FusedLogProbHead` plugs it into an unmodified model through hooks on ``lm_head``, inside the model's own
forward, so FSDP2 gathers the (tied) head weight and reduce-scatters its gradient as usual.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch.autograd.function import once_differentiable

from easyrl.models.families import family

__all__ = ["linear_log_probs", "FusedLogProbHead"]

DEFAULT_CHUNK_TOKENS = 512


def _chunk_log_probs(hidden_c, weight, temperature):
    logits = (hidden_c @ weight.t()).float().div_(temperature)
    return logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True))  # in place: logits -> log-probs


class _LinearLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk):
        n = hidden.shape[0]
        log_probs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk):
            logp = _chunk_log_probs(hidden[s:s + chunk], weight, temperature)
            log_probs[s:s + chunk] = logp.gather(-1, labels[s:s + chunk, None]).squeeze(-1)
            entropy[s:s + chunk] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(hidden, weight, labels, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        return log_probs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_lp, grad_ent):
        hidden, weight, labels, entropy = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk]
            logp = _chunk_log_probs(h, weight, temperature)
            p = logp.exp()
            # d logp_y / dz = onehot(y) - p;  dH / dz = -p (logp + H)
            g = torch.zeros_like(p)
            if grad_lp is not None:
                g_lp = grad_lp[s:s + chunk].float().unsqueeze(-1)
                g.sub_(p * g_lp).scatter_add_(-1, labels[s:s + chunk, None], g_lp)
            if grad_ent is not None:
                g_ent = grad_ent[s:s + chunk].float().unsqueeze(-1)
                g.sub_(p * (logp + entropy[s:s + chunk].unsqueeze(-1)) * g_ent)
            g = g.div_(temperature).to(weight.dtype)  # chain rule through z = (h W^T) / T
            if grad_hidden is not None:
                grad_hidden[s:s + chunk] = g @ weight
            if grad_weight is not None:  # the GEMM in the compute dtype (fp32 accumulation inside cuBLAS), summed
                grad_weight.add_(g.t() @ h)  # over chunks in fp32; fp32 operands would run ~10x slower on CUDA
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def linear_log_probs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                     chunk_tokens: int = DEFAULT_CHUNK_TOKENS, entropy_grad: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_probs, entropy)`` of the ``labels`` ``(tokens,)`` under ``softmax(hidden @ weight^T / temperature)``,
    each ``(tokens,)`` float32 (nats), without full logits: ``hidden`` ``(tokens, hidden_size)``, ``weight``
    ``(vocab, hidden_size)`` (bias-free, ``hidden``'s dtype); peak temporary ``chunk_tokens x vocab`` float32;
    ``entropy_grad`` False returns the entropy detached. ValueError on mismatched shapes, ``temperature <= 0`` or
    ``chunk_tokens < 1``."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} must be (tokens, hidden) "
                         "and (vocab, hidden)")
    if labels.shape != (hidden.shape[0],):
        raise ValueError(f"labels {tuple(labels.shape)} must be ({hidden.shape[0]},)")
    if not temperature > 0 or chunk_tokens < 1:
        raise ValueError(f"temperature ({temperature}) must be > 0 and chunk_tokens ({chunk_tokens}) >= 1")
    log_probs, entropy = _LinearLogProb.apply(hidden, weight, labels.long(), float(temperature), int(chunk_tokens))
    return log_probs, entropy if entropy_grad else entropy.detach()


class FusedLogProbHead:
    """Makes a causal LM's forward return ``[log-prob, entropy]`` per kept position instead of logits: inside
    ``head.scoring(labels, temperature)`` (``labels`` ``(tokens,)``), ``model(..., logits_to_keep=indices).logits`` is
    ``(1, tokens, 2)``; outside it the model behaves as before. A family ``logit_scale`` (Granite) is applied to the
    hidden states and divided out of the returned scores, which the model undoes. ValueError: ``model``'s output
    embedding is not a bias-free ``nn.Linear``."""

    def __init__(self, model: torch.nn.Module, chunk_tokens: int = DEFAULT_CHUNK_TOKENS):
        head = model.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear) or head.bias is not None:
            raise ValueError(f"{type(model).__name__}: the output embedding must be a bias-free nn.Linear")
        self.chunk_tokens = chunk_tokens
        config = getattr(model, "config", None)
        self.logit_scale = family(config).logit_scale(config)
        self._labels: Optional[torch.Tensor] = None
        self._temperature = 1.0
        self._entropy_grad = True
        self._hidden: Optional[torch.Tensor] = None
        self._keep: Optional[torch.Tensor] = None
        head.register_forward_pre_hook(self._pre_hook)
        head.register_forward_hook(self._hook)

    @contextmanager
    def scoring(self, labels: torch.Tensor, temperature: float, entropy_grad: bool = True,
                keep: Optional[torch.Tensor] = None) -> Iterator[None]:
        """Within the block, the head scores ``labels`` (``(tokens,)``) at the kept positions; ``keep``: their indices
        in the row (the ``logits_to_keep`` passed), taken here where the model's forward ignores that argument and runs
        its head on every position (MiniCPM-V 4.6)."""
        self._labels, self._temperature, self._entropy_grad, self._keep = labels, temperature, entropy_grad, keep
        try:
            yield
        finally:
            self._labels, self._hidden, self._keep = None, None, None

    def _pre_hook(self, module, args):
        if self._labels is None:
            return None
        (hidden,) = args
        self._hidden = hidden
        return (hidden[..., :0, :],)  # the linear runs on zero positions: no logits are made

    def _hook(self, module, args, output):
        if self._labels is None:
            return None
        hidden, self._hidden = self._hidden, None
        if (self._keep is not None and hidden.dim() == 3 and hidden.shape[1] != self._labels.shape[0]
                and hidden.shape[1] > int(self._keep.max())):  # every position: the model ignored logits_to_keep
            hidden = hidden[:, self._keep.to(hidden.device)]
        if hidden.shape[0] != 1 or hidden.shape[1] != self._labels.shape[0]:
            raise ValueError(f"FusedLogProbHead: {tuple(hidden.shape[:2])} kept positions for "
                             f"{self._labels.shape[0]} labels; pass logits_to_keep with one index per label")
        hidden = hidden[0] if self.logit_scale == 1.0 else hidden[0] * self.logit_scale  # (h W^T) s = (h s) W^T
        log_probs, entropy = linear_log_probs(hidden, module.weight, self._labels, self._temperature,
                                              self.chunk_tokens, self._entropy_grad)
        scores = torch.stack([log_probs[None], entropy[None]], dim=-1)  # a new tensor, not a view (FSDP2 hooks it)
        return scores if self.logit_scale == 1.0 else scores / self.logit_scale  # the model scales what we return
