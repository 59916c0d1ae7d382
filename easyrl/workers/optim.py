"""A trained role's optimizer and LR schedule (``worker.actor.optim``, ``worker.critic.optim``): AdamW with float32
or bfloat16 moments, constant or cosine after a linear warm-up, and optimizer-state offload.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from easyrl.config import OptimConfig

__all__ = ["BF16AdamW", "build_lr_scheduler", "build_optimizer", "lr_factor", "move_optimizer_state",
           "offloads_optimizer", "warmup_steps"]

LR_SCHEDULERS = ("constant", "cosine")
OPTIMIZERS = ("adamw", "adamw_bf16")


def warmup_steps(optim: OptimConfig, training_steps: int) -> int:
    """Optimizer steps of linear warm-up: ``optim.lr_warmup_steps`` when set, else
    ``int(lr_warmup_ratio * training_steps)`` (the run's steps)."""
    if optim.lr_warmup_steps is not None:
        return int(optim.lr_warmup_steps)
    return int(optim.lr_warmup_ratio * max(training_steps, 0))


def lr_factor(step: int, warmup: int, training_steps: int, kind: str = "constant",
              min_lr_ratio: float | None = None) -> float:
    """The factor on ``optim.lr`` for the update at ``step`` (0-based count of scheduler steps). Warm-up (``step <
    warmup``): ``(step + 1) / warmup``. Then ``constant``: 1; ``cosine``: ``max(m, m + (1 - m) * (1 + cos(pi * p)) /
    2)``, ``p = (step - warmup) / max(1, training_steps - warmup)``, ``m = min_lr_ratio`` (None: 0). Raises
    ``ValueError`` for an unknown ``kind`` or a ``min_lr_ratio`` outside [0, 1]."""
    if kind not in LR_SCHEDULERS:
        raise ValueError(f"lr_scheduler_type must be one of {LR_SCHEDULERS}, got {kind!r}")
    floor = 0.0 if min_lr_ratio is None else float(min_lr_ratio)
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"min_lr_ratio must lie in [0, 1], got {floor}")
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, training_steps - warmup))  # held at the floor past the end
    return max(floor, floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim: OptimConfig,
                       training_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` over :func:`lr_factor` with ``optim``'s ``lr_scheduler_type``, warm-up and ``min_lr_ratio`` for a
    run of ``training_steps`` steps."""
    warmup, total = warmup_steps(optim, training_steps), max(training_steps, 0)
    kind, floor = optim.lr_scheduler_type, optim.min_lr_ratio
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total, kind, floor))


class BF16AdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101, Algorithm 2) with both moments stored in bfloat16
    (``optim.strategy: adamw_bf16``, 4 bytes per parameter instead of 8), computed in float32 each step:
    ``p <- p (1 - lr wd)``; ``m <- b1 m + (1 - b1) g``; ``v <- b2 v + (1 - b2) g^2``;
    ``p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``. Element-wise: works on DTensor shards."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                t = state["step"].item()
                grad = p.grad.float()
                exp_avg = state["exp_avg"].float().mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
                denom = (exp_avg_sq / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
                update = (exp_avg / (1 - beta1 ** t)) / denom
                master = p.float().mul_(1 - group["lr"] * group["weight_decay"]).add_(update, alpha=-group["lr"])
                p.copy_(master)
        return loss


def build_optimizer(params: list[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer ``optim.strategy`` names over ``params``: ``adamw`` (torch's) or ``adamw_bf16``; else
    ``ValueError``."""
    strategy = optim.strategy
    kwargs = dict(lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    if strategy == "adamw":
        return torch.optim.AdamW(params, **kwargs)
    if strategy == "adamw_bf16":
        return BF16AdamW(params, **kwargs)
    raise ValueError(f"optim.strategy must be one of {OPTIMIZERS}, got {strategy!r}")


def offloads_optimizer(device: str, offload_params: bool, offload_optimizer: bool) -> bool:
    """Whether the optimizer states are moved to the host between updates: only on an accelerator, and only when
    the parameters stay on the device (``offload_params`` keeps them on the host already)."""
    return offload_optimizer and not offload_params and device != "cpu"


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move every tensor of ``optimizer``'s state (moments, DTensor shards included; not the ``step`` counters of
    torch's AdamW, which stay on the host) to ``device``, in place."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)
