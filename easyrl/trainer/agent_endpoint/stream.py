"""The agent endpoint's ``sample`` in training: each request goes to easyrl's driver-side request stream
(``easyrl.trainer.request_stream.RequestStream``) as a one-row prompt of token ids, and comes back with the engine's
ids, log-probs and weight versions."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Optional

__all__ = ["stream_sample"]

SAMPLING_FIELDS = ("temperature", "top_p", "top_k")


def stream_sample(stream: Callable[[], Any], response_length: int, *, follow_sampling: bool = False,
                  executor: Optional[concurrent.futures.Executor] = None,
                  overrides_of: Optional[Callable[[Any], Optional[dict[str, Any]]]] = None) -> Callable[..., Any]:
    """A ``sample`` for ``AgentEndpoint`` over the request stream ``stream()`` returns (called per request, so a
    stream re-made after ``close`` is picked up): submits ``token_prompt(prompt ids, budget, uid=session.id,
    seed=params.seed)`` and waits for it in ``executor`` (default: a thread pool of 256), returning a
    ``concurrent.futures.Future`` of ``(ids, log_probs, None, versions, routed_experts)``.

    ``budget``: the request's ``max_tokens`` (vLLM's serving layer sets it, within the context) cut to
    ``response_length`` tokens. The engine samples with the trainer's ``worker.rollout`` settings (the policy being
    trained) or those ``overrides_of(session)`` returns (e.g. validation's); ``follow_sampling`` passes the request's
    ``temperature`` / ``top_p`` / ``top_k`` instead as the stream's overrides. Stop strings, stop token ids and the agent's ``max_tokens`` are applied by the endpoint to what comes
    back (``SampleEngineClient.generate``). The future raises what ``RequestStream.wait`` raises (the engines' error,
    ``CancelledError`` when the stream was closed)."""
    pool = executor or concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="easyrl-agent")

    def sample(session: Any, prompt_ids: list[int], params: Any) -> concurrent.futures.Future:
        from easyrl.trainer.request_stream import token_prompt

        budget = min(params.max_tokens or response_length, response_length)
        prompt = token_prompt(prompt_ids, budget, uid=session.id, seed=params.seed)
        if follow_sampling:
            overrides = {name: getattr(params, name) for name in SAMPLING_FIELDS}
        else:
            overrides = overrides_of(session) if overrides_of is not None else None

        def run() -> tuple:
            requests = stream()
            [(ids, log_probs, versions, routed)] = requests.wait(requests.submit(prompt, overrides))
            return list(ids), log_probs, None, list(versions), routed

        return pool.submit(run)

    return sample
