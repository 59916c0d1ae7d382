"""The engine behind vLLM's OpenAI serving layer in the agent endpoint: an ``EngineClient`` whose ``generate`` hands
the token ids vLLM's renderer rendered, and the request's ``SamplingParams``, to a ``sample`` callable (easyrl's
request stream in training), then turns the sampled ids into vLLM ``RequestOutput`` s with vLLM's own front-end
pieces, as ``AsyncLLM`` does: ``InputProcessor`` (validation, the generation config's EOS / stop ids) and
``OutputProcessor`` (incremental detokenization, stop strings, log-probs, delta / final outputs).

What the serving layer calls on it (vLLM 0.23 and 0.32): ``vllm_config``, ``model_config``, ``renderer``,
``input_processor``, ``errored`` / ``dead_error`` / ``is_running``, ``check_admission`` (0.32), ``generate``,
``abort``, ``get_supported_tasks``, ``do_log_stats``, ``is_tracing_enabled`` (0.23), ``add_lora`` (static LoRA
modules only). The rest of vLLM's ``EngineClient`` (sleep, weights, profiling, pooling) is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
from collections.abc import AsyncGenerator, Iterable
from typing import Any, Callable, Optional

from vllm.engine.protocol import EngineClient
from vllm.exceptions import VLLMValidationError
from vllm.renderers import renderer_from_config
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import EngineCoreOutput, FinishReason
from vllm.v1.engine.exceptions import EngineGenerateError
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.engine.output_processor import OutputProcessor

from easyrl.agents.segments import RequestRecord

__all__ = ["SampleEngineClient", "Sample", "SampleResult", "CURRENT_SESSION", "CURRENT_ROUTE"]

SampleResult = tuple
"""``(token_ids, log_probs | None, finish_reason | None)``, or with a fourth item ``versions | None`` and a fifth
``routed_experts | None``: the sampled tokens (EOS included when the engine stopped on it), the engine's log-prob of
each (nats), ``"stop"`` / ``"length"`` / ``"abort"`` or None (then the stop rule of
:meth:`SampleEngineClient.generate` decides), the weight version that sampled each token, and the experts the
engine's routers chose at each position it ran (routing replay: ``RequestRecord.routed_experts``)."""

Sample = Callable[[Any, list[int], SamplingParams], Any]
"""``sample(session, prompt_token_ids, sampling_params)`` -> a :data:`SampleResult`, an awaitable of one, or a
``concurrent.futures.Future`` of one. Called on the endpoint's event loop: it must not block (hand the work to
another thread and return a future)."""

CURRENT_SESSION: contextvars.ContextVar[Any] = contextvars.ContextVar("easyrl_agent_session", default=None)
"""The session of the HTTP request being served (set by the endpoint's ASGI layer)."""
CURRENT_ROUTE: contextvars.ContextVar[str] = contextvars.ContextVar("easyrl_agent_route", default="")
"""The API path of the HTTP request being served, without the session prefix."""

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


class SampleEngineClient(EngineClient):
    """vLLM's ``EngineClient`` over ``sample`` (:data:`Sample`), for a ``vllm_config`` built without an engine
    (``easyrl.trainer.agent_endpoint.server``). Each finished request is handed to
    ``record(session, RequestRecord)``.

    Counters (read from any thread): ``requests`` served, ``aborted`` (the client went away first),
    ``failed`` (``sample`` raised), ``refused`` (a request the endpoint cannot serve: n > 1, prompt log-probs,
    multi-modal or streamed input)."""

    def __init__(self, vllm_config: Any, sample: Sample, record: Callable[[Any, RequestRecord], None]):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.renderer = renderer_from_config(vllm_config)
        self.input_processor = InputProcessor(vllm_config, self.renderer)
        self.output_processor = OutputProcessor(self.renderer.tokenizer, log_stats=False)
        self.sample = sample
        self.record = record
        self.requests = self.aborted = self.failed = self.refused = 0
        self._pending: dict[str, Any] = {}  # internal request id -> the sample call in flight

    # ------------------------------------------------------------------------------------ state the layer reads
    @property
    def is_running(self) -> bool:
        return True

    @property
    def is_stopped(self) -> bool:
        return False

    @property
    def errored(self) -> bool:
        return False

    @property
    def dead_error(self) -> BaseException:
        return EngineGenerateError("the agent endpoint's engine is not dead")

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    async def is_tracing_enabled(self) -> bool:
        return False

    async def do_log_stats(self) -> None:
        return None

    async def check_health(self) -> None:
        return None

    async def is_sleeping(self) -> bool:
        return False

    async def is_paused(self) -> bool:
        return False

    async def add_lora(self, lora_request: Any) -> bool:
        raise NotImplementedError("the agent endpoint serves the policy being trained, no LoRA adapters by name")

    # ------------------------------------------------------------------------------------------------ generate
    def generate(self, prompt: Any, sampling_params: SamplingParams, request_id: str, *,
                 prompt_text: Optional[str] = None, lora_request: Any = None,
                 **kwargs: Any) -> AsyncGenerator[Any, None]:
        """The ``RequestOutput`` s of one request: per sampled token in ``DELTA`` mode (streaming), the final one
        otherwise, after ``sample`` returned (so a stream's first token comes when the whole response was sampled).
        The session is the one of the HTTP request calling this (:data:`CURRENT_SESSION`).

        Tokens are served as the engine would stop on them: at the first EOS (unless ``ignore_eos``) or
        ``stop_token_ids`` token (``"stop"``), at ``max_tokens`` or the context end (``"length"``), at a stop string
        (vLLM's detokenizer, ``"stop"``); else the ``finish_reason`` ``sample`` gave (``"length"`` if None). Raises
        ``VLLMValidationError`` (HTTP 400) for what it cannot serve, ``EngineGenerateError`` (HTTP 500, or an error
        chunk in a stream) when ``sample`` raised."""
        return self._generate(CURRENT_SESSION.get(), CURRENT_ROUTE.get(), prompt, sampling_params, request_id,
                              prompt_text, lora_request)

    async def _generate(self, session: Any, route: str, prompt: Any, params: SamplingParams, request_id: str,
                        prompt_text: Optional[str], lora_request: Any) -> AsyncGenerator[Any, None]:
        self._check(session, prompt, params, lora_request)
        request = self.input_processor.process_inputs(request_id, prompt, params, supported_tasks=("generate",))
        self.input_processor.assign_request_id(request)
        rid = request.request_id
        if prompt_text is None and isinstance(prompt, dict):
            prompt_text = prompt.get("prompt")
        self.output_processor.add_request(request, prompt_text, None, 0, None)
        finished = False
        try:
            params = request.sampling_params
            prompt_ids = list(request.prompt_token_ids)
            try:
                token_ids, log_probs, reason, versions, routed = await self._call_sample(rid, session, prompt_ids,
                                                                                         params)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.failed += 1
                raise EngineGenerateError(f"sampling failed: {type(err).__name__}: {err}") from err
            served, last = 0, None
            for token, finish, stop_reason in _stops(token_ids, params, len(prompt_ids),
                                                     self.model_config.max_model_len, reason):
                output = EngineCoreOutput(request_id=rid, new_token_ids=[] if token is None else [token],
                                          new_logprobs=_logprobs(token, log_probs, served, params),
                                          finish_reason=finish, stop_reason=stop_reason)
                served += token is not None
                done = False
                for last in self.output_processor.process_outputs([output]).request_outputs:
                    done = done or last.finished
                    yield last
                if done:  # on its last token, or at a stop string (vLLM's detokenizer)
                    break
            finished = True
            self.requests += 1
            self.record(session, RequestRecord(
                prompt_ids=prompt_ids, response_ids=token_ids[:served],
                log_probs=None if log_probs is None else log_probs[:served],
                finish_reason=last.outputs[0].finish_reason if last is not None else None, route=route,
                versions=None if versions is None else versions[:served], routed_experts=routed))
        finally:
            self._pending.pop(rid, None)
            if not finished:
                self.aborted += 1
                self.output_processor.abort_requests([rid], internal=True)

    def _check(self, session: Any, prompt: Any, params: SamplingParams, lora_request: Any) -> None:
        problem = None
        if session is None:
            problem = "no open agent session: call the endpoint through a session's base_url"
        elif getattr(session, "closed", False):
            problem = f"agent session {session.id!r} is closed"
        elif not isinstance(prompt, dict) or prompt.get("type", "token") != "token":
            problem = "the agent endpoint serves text prompts only (token ids; no images, embeddings or streams)"
        elif params.n != 1:
            problem = "the agent endpoint samples one completion per request: n must be 1"
        elif params.prompt_logprobs is not None:
            problem = "the agent endpoint does not compute prompt log-probs"
        elif lora_request is not None:
            problem = "the agent endpoint serves the policy being trained, no LoRA adapters by name"
        if problem is not None:
            self.refused += 1
            raise VLLMValidationError(problem)

    async def _call_sample(self, rid: str, session: Any, prompt_ids: list[int],
                           params: SamplingParams) -> tuple:
        result = self.sample(session, prompt_ids, params)
        if isinstance(result, concurrent.futures.Future):
            result = asyncio.wrap_future(result)
        if inspect.isawaitable(result):
            self._pending[rid] = result
            result = await result
        token_ids, log_probs, reason, versions, routed = (*result, None, None)[:5]
        for name, values in (("log-probs", log_probs), ("versions", versions)):
            if values is not None and len(values) != len(token_ids):
                raise ValueError(f"sample returned {len(token_ids)} tokens but {len(values)} {name}")
        if reason is not None and reason not in _FINISH:
            raise ValueError(f"sample returned finish_reason {reason!r}: expected one of {sorted(_FINISH)} or None")
        return (list(token_ids), None if log_probs is None else [float(x) for x in log_probs], reason,
                None if versions is None else [int(v) for v in versions], routed)

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        """Forget the requests (their sampling goes on in the engine; its result is dropped)."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in self.output_processor.abort_requests(ids, internal):
            pending = self._pending.pop(rid, None)
            if pending is not None and hasattr(pending, "cancel"):
                pending.cancel()

    # ------------------------------------------------------------------------------------------- refused calls
    def encode(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the agent endpoint serves generation only")

    async def notify_kv_transfer_request_rejected(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def start_profile(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("the agent endpoint has no engine to profile")

    async def stop_profile(self) -> None:
        raise NotImplementedError("the agent endpoint has no engine to profile")

    async def reset_mm_cache(self) -> None:
        return None

    async def reset_encoder_cache(self) -> None:
        return None

    async def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        return False

    async def sleep(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("easyrl puts the rollout engines to sleep, not the agent endpoint")

    async def release_kv_cache_memory(self) -> None:
        raise NotImplementedError("easyrl manages the rollout engines' memory, not the agent endpoint")

    async def wake_up(self, tags: Optional[list[str]] = None) -> bool:
        raise NotImplementedError("easyrl wakes the rollout engines, not the agent endpoint")

    async def pause_generation(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("easyrl pauses the rollout engines (RequestStream.paused), not the agent endpoint")

    async def resume_generation(self) -> None:
        raise NotImplementedError("easyrl pauses the rollout engines (RequestStream.paused), not the agent endpoint")

    def shutdown(self, timeout: Optional[float] = None) -> None:
        return None


def _stops(token_ids: list[int], params: SamplingParams, prompt_len: int, max_model_len: int,
           reason: Optional[str]):
    """``(token, finish_reason | None, stop_reason)`` per served token, the engine core's stop rule
    (``vllm.v1.core.sched.utils.check_stop``) applied to ``token_ids``: EOS or a stop token id ends with STOP, then
    ``max_tokens`` / the context end with LENGTH; the last token otherwise ends with ``reason`` (LENGTH if None). No
    tokens: one ``(None, reason (ABORT if None), None)``."""
    if not token_ids:
        yield None, _FINISH.get(reason or "abort", FinishReason.ABORT), None
        return
    eos = params.eos_token_id
    stop_ids = set(params.stop_token_ids or ())
    limit = params.max_tokens if params.max_tokens is not None else max_model_len
    for i, token in enumerate(token_ids):
        count = i + 1
        if token == eos:
            yield token, FinishReason.STOP, None
            return
        if token in stop_ids:
            yield token, FinishReason.STOP, token
            return
        if count >= limit or prompt_len + count >= max_model_len:
            yield token, FinishReason.LENGTH, None
            return
        if count == len(token_ids):
            yield token, _FINISH.get(reason or "length", FinishReason.LENGTH), None
            return
        yield token, None, None


def _logprobs(token: Optional[int], log_probs: Optional[list[float]], i: int, params: SamplingParams) -> Any:
    """The sampled token's log-prob as vLLM's ``LogprobsLists`` (no top-k alternatives: the engine samples with
    ``logprobs=0``), when the request asked for log-probs; None otherwise."""
    if token is None or params.logprobs is None:
        return None
    import numpy as np
    from vllm.v1.outputs import LogprobsLists

    value = float(log_probs[i]) if log_probs is not None else float("nan")
    return LogprobsLists(np.array([[token]], dtype=np.int64), np.array([[value]], dtype=np.float32),
                         np.array([1], dtype=np.int64))
