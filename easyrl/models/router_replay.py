"""Routing replay for mixture-of-experts policies: the training forward sends each token to given experts instead of
its router's own top-k (Ma et al. 2025, arXiv:2510.11370, Sec. 3: R3 replays the experts the rollout engine chose;
R2 those the old policy's forward chose, which :meth:`RouterReplay.record` keeps).

The router still computes its logits; only the choice of experts is replaced, and their weights are recomputed from
the router's own logits over the replayed experts as the family's router computes them (:class:`RouterKind`), so the
router keeps its gradient. A token whose replayed experts are ``-1`` (padding, a token the engine never ran) keeps
its own top-k. The routing tensor is ``(tokens, layers, top_k)`` of expert ids in the order the routers see the
tokens; ``layers`` counts the decoder layers (a dense layer's row is never read), as vLLM's
``CompletionOutput.routed_experts`` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

__all__ = ["RouterKind", "SOFTMAX_TOPK", "TOPK_SOFTMAX", "RouterReplay", "NO_EXPERT"]

NO_EXPERT = -1
"""The expert id of a token that keeps its own routing."""


def _softmax_topk_weights(router: torch.nn.Module, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Qwen3-MoE, Qwen3-VL-MoE, Qwen3.5-MoE, OLMoE, Mixtral: softmax over all experts, the chosen ones' probabilities,
    renormalised to sum 1 unless the router's ``norm_topk_prob`` is False (Mixtral and Qwen3-VL-MoE always do)."""
    weights = torch.softmax(logits.float(), dim=-1).gather(-1, experts)
    if getattr(router, "norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights


def _topk_softmax_weights(router: torch.nn.Module, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Granite MoE: softmax over the chosen experts' logits only."""
    return torch.softmax(logits.float().gather(-1, experts), dim=-1)


@dataclass(frozen=True)
class RouterKind:
    """How one family's router forward (transformers 5.19) returns its decision and weighs the chosen experts.

    ``outputs``: the names of its output tuple in order (``logits`` ``(tokens, experts)``, ``weights`` ``(tokens,
    k)``, ``experts`` ``(tokens, k)``); ``weights_of(router, logits, experts)``: the chosen experts' weights
    ``(tokens, k)`` float32 from the router's logits."""

    outputs: tuple[str, str, str]
    weights_of: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


SOFTMAX_TOPK = RouterKind(("logits", "weights", "experts"), _softmax_topk_weights)
"""``*TopKRouter`` of Qwen3-MoE, Qwen3-VL-MoE, Qwen3.5-MoE, OLMoE, Mixtral: top-k of the softmax."""
TOPK_SOFTMAX = RouterKind(("experts", "weights", "logits"), _topk_softmax_weights)
"""``GraniteMoeTopKRouter``: top-k of the logits, softmax over those."""

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class RouterReplay:
    """Forward hooks on every router of ``model`` (modules whose class name ends in ``TopKRouter``, under a
    ``layers.<i>.`` decoder layer): while :meth:`arm` holds a routing tensor, each router's experts are replaced by
    it; with None, the routers run as they are. After :meth:`record`, the experts used are kept. Armed routing stays
    until the next :meth:`arm`: gradient checkpointing re-runs the routers during the backward pass.

    ``agreement()`` counts, over the replayed (token, layer) pairs of the forwards outside a backward pass, the share
    of replayed experts that the router's own top-k holds too (``moe/router_agreement``); ``expert_load()`` how
    unevenly those forwards spread the tokens over the experts (``moe/expert_load_max``).

    Raises ``ValueError`` when ``model`` has no router (a dense model)."""

    def __init__(self, model: torch.nn.Module, kind: RouterKind):
        self.kind = kind
        self.routing: Optional[torch.Tensor] = None
        self._recorded: Optional[dict[int, torch.Tensor]] = None  # layer -> (tokens, k) int16, while recording
        self._counts: Optional[torch.Tensor] = None  # (matched, replayed), on the routers' device: no sync per layer
        self._load: dict[int, torch.Tensor] = {}  # layer -> tokens sent to each expert, (experts,)
        self.layers: list[int] = []
        for name, module in model.named_modules():
            match = _LAYER.search(name)
            if type(module).__name__.endswith("TopKRouter") and match:
                module.register_forward_hook(self._hook(int(match.group(1))))
                self.layers.append(int(match.group(1)))
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no *TopKRouter module under its decoder layers: routing "
                             "replay needs a mixture-of-experts model")

    def arm(self, routing: Optional[torch.Tensor]) -> None:
        """Replay ``routing`` ``(tokens, layers, top_k)`` integer expert ids (``NO_EXPERT``: the router's own) in the
        next forwards, tokens in the order the routers see them; None: no replay."""
        self.routing = routing

    def record(self) -> None:
        """Keep the experts every router uses in the next forward (its own, or the replayed ones) for
        :meth:`take_recorded`."""
        self._recorded = {}

    def take_recorded(self) -> torch.Tensor:
        """The experts the routers used since :meth:`record`: ``(tokens, layers, top_k)`` int16 on their device,
        ``layers`` up to the last routed decoder layer (``NO_EXPERT`` in a dense layer's row); recording stops.
        Raises ``RuntimeError`` when no router ran since :meth:`record`."""
        recorded, self._recorded = self._recorded, None
        if not recorded:
            raise RuntimeError("routing replay: no router ran since record()")
        first = next(iter(recorded.values()))
        out = first.new_full((first.shape[0], max(self.layers) + 1, first.shape[1]), NO_EXPERT)
        for layer, experts in recorded.items():
            out[:, layer] = experts
        return out

    def agreement(self) -> Optional[float]:
        """The share of replayed experts the routers' own top-k also chose since the last call; None if none."""
        if self._counts is None:
            return None
        matched, replayed = self._counts.tolist()
        self._counts = None
        return matched / replayed if replayed else None

    def expert_load(self) -> Optional[float]:
        """The busiest expert's share of its layer's routed slots times the number of experts (1: balanced; the
        number of experts: every token on one), the largest over the layers, over the replayed forwards outside a
        backward pass since the last call; None if none."""
        load, self._load = self._load, {}
        if not load:
            return None
        return max((counts.max() / counts.float().mean()).item() for counts in load.values())

    def _hook(self, layer: int) -> Callable[..., Any]:
        def hook(router: torch.nn.Module, args: Any, output: tuple) -> Optional[tuple]:
            if self.routing is None:
                if self._recorded is not None:
                    self._recorded[layer] = dict(zip(self.kind.outputs, output))["experts"].to(torch.int16)
                return None
            named = dict(zip(self.kind.outputs, output))
            own, logits = named["experts"], named["logits"]
            if self.routing.shape[0] != own.shape[0] or layer >= self.routing.shape[1]:
                raise ValueError(f"routing replay: layer {layer}'s router saw {own.shape[0]} tokens, the replayed "
                                 f"routing holds {tuple(self.routing.shape)} (tokens, layers, top_k)")
            replay = self.routing[:, layer].to(own.device, torch.long)
            if replay.shape[-1] != own.shape[-1]:
                raise ValueError(f"routing replay: the router picks {own.shape[-1]} experts, the replayed routing "
                                 f"{replay.shape[-1]}")
            kept = (replay >= 0).all(-1, keepdim=True)
            experts = torch.where(kept, replay, own)
            if torch._C._current_graph_task_id() == -1:  # not a recomputation inside the backward
                held = (own.unsqueeze(-1) == replay.unsqueeze(-2)).any(-1) & kept  # (tokens, k)
                counts = torch.stack([held.sum(), kept.sum() * own.shape[-1]]).double()
                self._counts = counts if self._counts is None else self._counts + counts
                load = torch.bincount(experts.flatten(), minlength=logits.shape[-1])
                self._load[layer] = load + self._load[layer] if layer in self._load else load
            weights = self.kind.weights_of(router, logits, experts).to(named["weights"].dtype)
            named.update(experts=experts.to(own.dtype), weights=weights)
            if self._recorded is not None:
                self._recorded[layer] = experts.to(torch.int16)
            return tuple(named[key] for key in self.kind.outputs)
        return hook
