"""The experts vLLM's MoE routers chose for each token of each request, captured inside the engine, for routing replay
(``easyrl.models.router_replay``) where vLLM does not return them itself.

vLLM 0.32 returns them (``enable_return_routed_experts``, ``CompletionOutput.routed_experts``) only from its GPU
model runner (V2). On the CPU :func:`start_capture` hooks the same place vLLM's own capturer does, each router's
``BaseRouter.set_capture_fn`` (called with the step's ``(tokens, top_k)`` expert ids, before any expert-parallel
remapping), and the model runner's ``_model_forward``, whose batch layout (``input_batch.req_ids``,
``query_start_loc``, ``num_computed_tokens_cpu``) says which request and position each row belongs to. A position
keeps the experts of the first forward that ran it: a request preempted or recomputed after an in-flight weight
update keeps the routing of the weights that sampled its tokens. Tokens served from the prefix cache were never run
in this request: they stay ``NO_EXPERT`` unless an earlier forward of the same request ran them.

The functions run inside vLLM's worker (``LLM.collective_rpc``), each taking the worker first.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Optional

import numpy as np
import torch

from easyrl.models.router_replay import NO_EXPERT

__all__ = ["start_capture", "take_routing", "capture_supported"]

_ATTR = "_easyrl_routing_capture"


def capture_supported() -> bool:
    """Whether this vLLM's CPU MoE layers call their router's capture callback (``BaseRouter.set_capture_fn``):
    vLLM >= 0.32. vLLM 0.23 has the callback, but its CPU MoE kernel is monolithic and routes without the router
    (and fails outside a config context, measured 2026-12-02)."""
    from easyrl.workers.vllm_compat import vllm_version

    try:
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
    except ImportError:
        return False
    return (vllm_version() or (0, 0)) >= (0, 32) and hasattr(BaseRouter, "set_capture_fn")


class _Capture:
    """Per-request chunks ``(start position, (tokens, layers, top_k) int16)`` of one engine's forwards."""

    def __init__(self, runner: Any, layers: int, top_k: int):
        self.runner, self.layers, self.top_k = runner, layers, top_k
        self.step: dict[int, torch.Tensor] = {}
        self.chunks: dict[str, list[tuple[int, np.ndarray]]] = {}

    def capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        self.step[layer] = topk_ids

    def forward(self, inner: Any, *args: Any, **kwargs: Any) -> Any:
        self.step = {}
        out = inner(*args, **kwargs)
        batch = self.runner.input_batch
        requests = batch.num_reqs
        if requests and self.step:
            bounds = self.runner.query_start_loc.np[: requests + 1].tolist()
            starts = batch.num_computed_tokens_cpu[:requests].tolist()
            rows = np.full((bounds[-1], self.layers, self.top_k), NO_EXPERT, dtype=np.int16)
            for layer, ids in self.step.items():
                rows[:, layer] = ids[: bounds[-1]].to("cpu", torch.int16).numpy()
            for i, request in enumerate(batch.req_ids[:requests]):
                if bounds[i + 1] > bounds[i]:
                    self.chunks.setdefault(request, []).append((int(starts[i]), rows[bounds[i]:bounds[i + 1]]))
        self.step = {}
        return out

    def take(self, request: str) -> Optional[np.ndarray]:
        """``(positions, layers, top_k)`` of the request (``NO_EXPERT`` where none ran), forgotten after; None if
        no forward ran it."""
        chunks = self.chunks.pop(request, None)
        if not chunks:
            return None
        length = max(start + len(rows) for start, rows in chunks)
        out = np.full((length, self.layers, self.top_k), NO_EXPERT, dtype=np.int16)
        seen = np.zeros(length, dtype=bool)
        for start, rows in chunks:  # in forward order: the first forward of a position wins
            fresh = ~seen[start:start + len(rows)]
            out[start:start + len(rows)][fresh] = rows[fresh]
            seen[start:start + len(rows)] = True
        return out


def start_capture(worker: Any) -> list[int]:
    """Bind the capture to every MoE router of the worker's model and wrap its model runner's forward (once).
    Returns ``[layers, top_k]`` of the routing it records. Raises ``ValueError`` when the model has no router that
    takes a capture callback."""
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    runner = worker.model_runner
    capture = getattr(runner, _ATTR, None)
    if capture is not None:
        return [capture.layers, capture.top_k]
    config = runner.model_config
    capture = _Capture(runner, config.get_total_num_hidden_layers(), config.get_num_experts_per_tok())
    bound = 0
    for module in runner.get_model().modules():
        router = getattr(module, "router", None)
        if isinstance(router, BaseRouter) and hasattr(module, "layer_id"):
            router.set_capture_fn(partial(capture.capture, module.layer_id))
            bound += 1
    if not bound:
        raise ValueError(f"{config.hf_config.model_type}: no MoE router of vLLM's model takes a capture callback")
    runner._model_forward = partial(capture.forward, runner._model_forward)
    setattr(runner, _ATTR, capture)
    return [capture.layers, capture.top_k]


def take_routing(worker: Any, request_ids: list[str]) -> list[Optional[np.ndarray]]:
    """The captured routing of each of ``request_ids`` (the ids given to ``add_request``; vLLM >= 0.24 runs them
    as ``<id>-<8 random characters>``), or None for one never run; forgotten after."""
    capture = getattr(worker.model_runner, _ATTR)
    internal = {}
    for key in capture.chunks:
        internal.setdefault(key, key)
        internal.setdefault(key.rsplit("-", 1)[0], key)
    return [capture.take(internal[r]) if r in internal else None for r in request_ids]
