"""A vLLM engine driven request by request (continuous batching): a request is admitted whenever the caller adds it,
and leaves as soon as it finishes; nothing waits for a batch's longest response.

The in-process ``LLMEngine`` under ``vllm.LLM`` (``add_request`` / ``step``, the loop ``LLM.generate`` runs) is
driven directly, so the colocated in-process weight sync is unchanged; why not ``AsyncLLM``: docs/architecture.md,
"The rollout engine". Each sampled token is tagged with the engine's weight ``version`` at the step that sampled it,
so a response whose requests span an in-flight weight update (:meth:`RequestEngine.reload`) records which weights
wrote each token (docs/async.md, "Partial rollouts").
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = ["Finished", "RequestEngine"]


@dataclass
class Finished:
    """One finished request: ``token_ids`` the sampled tokens (EOS included when it stopped on it), ``log_probs``
    vLLM's log-prob of each (None unless asked for), ``versions`` the engine's weight version when each was
    sampled (same length as ``token_ids``), ``routed_experts`` the experts vLLM's routers chose for each token it ran
    (``(positions, layers, top_k)`` int, ``-1`` where none ran; None unless the engine records routing)."""

    key: Hashable
    token_ids: list[int] = field(default_factory=list)
    log_probs: Optional[list[float]] = None
    versions: list[int] = field(default_factory=list)
    routed_experts: Any = None


class RequestEngine:
    """The request-level loop over ``llm`` (a ``vllm.LLM``): :meth:`add` admits a request at once, :meth:`step`
    runs one engine step (every admitted request advances by one token, prefills as the scheduler allows) and returns
    the requests that finished in it.

    ``routing``: None, or for a routing-replay run the captured routing of finished request ids
    (``routing_capture.take_routing`` through the engine), where vLLM's outputs do not carry ``routed_experts``.

    ``slot_steps`` / ``busy_steps`` count, over the steps run, the decode slots offered (``slots`` per step: the
    caller's capacity) and those holding a request: their ratio is the engine's slot occupancy (``rollout/
    slot_occupancy``).
    """

    def __init__(self, llm: Any, version: int = 0,
                 routing: Optional[Callable[[list[str]], list[Any]]] = None):
        self.llm = llm
        self.version = version
        self.routing = routing
        self._live: dict[str, Finished] = {}
        self._counter = 0
        self.slot_steps = 0
        self.busy_steps = 0

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished."""
        return len(self._live)

    def add(self, key: Hashable, prompt: dict[str, Any], params: Any) -> None:
        """Admit ``prompt`` (``{"prompt_token_ids": ..., "multi_modal_data": ...}``) with ``params`` (one
        ``SamplingParams`` with ``n=1``; its output kind is set to per-step deltas); its :class:`Finished` comes back
        under ``key``."""
        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.DELTA  # every step's new tokens: each is tagged with its version
        request_id = f"easyrl-{self._counter}"
        self._counter += 1
        self.llm.llm_engine.add_request(request_id, prompt, params)
        self._live[request_id] = Finished(key, log_probs=[] if params.logprobs is not None else None)

    def step(self, slots: int = 0) -> list[Finished]:
        """One engine step; returns the requests that finished in it, in no set order. ``slots``: the decode slots
        this step offers, for the occupancy counts (0: the requests in flight)."""
        self.busy_steps += self.in_flight
        self.slot_steps += max(slots, self.in_flight)
        done, ids = [], []
        for output in self.llm.llm_engine.step():
            state = self._live.get(output.request_id)
            if state is None:
                continue
            sample = output.outputs[0]
            state.token_ids.extend(sample.token_ids)
            state.versions.extend([self.version] * len(sample.token_ids))
            if state.log_probs is not None:
                state.log_probs.extend(step[token].logprob for step, token in zip(sample.logprobs or [],
                                                                                  sample.token_ids))
            if getattr(sample, "routed_experts", None) is not None:  # vLLM's own (its GPU model runner)
                state.routed_experts = sample.routed_experts
            if output.finished:
                done.append(self._live.pop(output.request_id))
                ids.append(output.request_id)
        if self.routing is not None and done:
            for state, routed in zip(done, self.routing(ids)):
                if state.routed_experts is None:  # vLLM's own wins
                    state.routed_experts = routed
        return done

    def run(self, slots: int = 0, progress: Any = None) -> list[Finished]:
        """Step until every admitted request finished; returns them in no set order. ``progress``: a ``tqdm`` bar
        advanced by each finished request (closed at the end), or None."""
        done: list[Finished] = []
        while self._live:
            finished = self.step(slots)
            done.extend(finished)
            if progress is not None and finished:
                progress.update(len(finished))
        if progress is not None:
            progress.close()
        return done

    def abort(self) -> int:
        """Drop every request in flight (their tokens are lost); returns how many."""
        ids = list(self._live)
        if ids:
            self.llm.llm_engine.abort_request(ids)
            if self.routing is not None:
                self.routing(ids)  # taken, so their captured routing is forgotten
        self._live.clear()
        return len(ids)

    def reload(self, version: int) -> None:
        """After the engine's weights were replaced in place (requests still in flight): later tokens are of
        ``version``, and every request in flight drops its KV cache, which the next step recomputes from its prompt
        and tokens so far with the new weights (vLLM's ``reset_prefix_cache(reset_running_requests=True)``: the
        running requests are preempted, not aborted). Every token's log-prob is then the new weights' exactly."""
        self.version = version
        self.llm.reset_prefix_cache(reset_running_requests=True)
