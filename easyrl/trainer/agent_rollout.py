"""The agent rollout (``worker.rollout.agent``; docs/agents.md, "Bring your agent"): each sample is one session of the
user's agent against the OpenAI-compatible endpoint (``easyrl.trainer.agent_endpoint``) whose requests the engines
sample request by request; its trajectory is the session's last segment (``easyrl.agents.segments``), token-exact:
the prompt as vLLM's renderer rendered it, the sampled tokens (mask 1, the engine's log-probs, weight versions and,
with routing replay, routed experts) and what the agent's later requests added between them (tool results,
chat-template tokens: mask 0, the actor's own routing). A broken session's earlier segments ride along in the extra
``agent_segments`` and become rows of their own in the step (``easyrl.trainer.session_rows``).

A session that fails (the agent raised, ran past ``timeout_s``, made no request, or its prompt does not fit
``data.max_prompt_length``) trains nothing: an empty response (mask 0) after the data's prompt, counted in
``agent/*`` and named once in the log with its row; the run goes on.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, Optional

import torch

from easyrl.agents.segments import Segment
from easyrl.agents.specs import load_callable
from easyrl.batch import Batch
from easyrl.errors import ConfigError
from easyrl.trainer.request_stream import RequestStream
from easyrl.trainer.rollout import left_pad, right_pad, trajectory_batch, turns_routing_batch
from easyrl.workers.fsdp_worker import FSDPWorker

__all__ = ["AgentRollout", "agent_metrics", "load_agent", "segments_batch", "session_trajectory"]

logger = logging.getLogger("easyrl.agents")

KEY = "worker.rollout.agent.entry_point"
CALLED_AS = "fn(task=..., base_url=..., api_key=..., model=...)"


def load_agent(spec: str) -> Callable[..., Any]:
    """The agent function of ``spec`` (``path/to/file.py:function``). Raises ``ConfigError`` (``load_callable``'s,
    or a signature that cannot take the four keyword arguments of ``CALLED_AS``)."""
    fn = load_callable(spec, KEY)
    try:
        inspect.signature(fn).bind(task={}, base_url="", api_key="", model="")
    except TypeError as err:
        raise ConfigError(f"{KEY}={spec!r}: {fn.__name__}{inspect.signature(fn)} cannot be called as {CALLED_AS} "
                          f"({err}); give it these four parameters (or **kwargs).") from None
    except ValueError:  # a builtin without a signature: called as is
        pass
    return fn


def check_tool_call_parser(name: Optional[str]) -> None:
    """``worker.rollout.agent.tool_call_parser`` names one of this vLLM's tool-call parsers (or is null). Raises
    ``ConfigError`` with the close names and the list, before the endpoint starts (vLLM's serving layer is imported
    here: the endpoint imports it anyway)."""
    if name is None:
        return
    import difflib

    from vllm.tool_parsers import ToolParserManager

    known = sorted(ToolParserManager.list_registered())
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError(f"worker.rollout.agent.tool_call_parser={name!r} is not a tool-call parser of this vLLM: "
                          f"{hint}it has {', '.join(known)} (hermes for Qwen2.5/Qwen3); null: tool calls are not "
                          "parsed.")


def session_trajectory(segments: list[Segment], max_prompt_length: int
                       ) -> tuple[Optional[Segment], list[Segment], int, str]:
    """What a session trains: ``(last, earlier, too_long, why)``. ``last``: the segment holding the final answer (its
    last request), the session's scoring row, or None and ``why`` not: ``"no_requests"``, ``"prompt_too_long"`` (its
    prompt is longer than ``max_prompt_length`` tokens; then nothing of the session trains). ``earlier``: the other
    segments that train as samples of their own (docs/agents.md), in the order they started; those holding no
    sampled token are left out, and those whose prompt is too long too (counted in ``too_long``)."""
    if not segments:
        return None, [], 0, "no_requests"
    last = max(segments, key=lambda segment: segment.requests[-1])
    if len(last.prompt_ids) > max_prompt_length:
        return None, [], 0, "prompt_too_long"
    others = [segment for segment in segments if segment is not last and segment.sampled_tokens]
    earlier = [segment for segment in others if len(segment.prompt_ids) <= max_prompt_length]
    return last, earlier, len(others) - len(earlier), ""


def agent_metrics(batch: Batch) -> dict[str, float]:
    """``agent/*`` of an agent batch ({} otherwise), over its sessions (the scoring rows,
    ``easyrl.trainer.session_rows``): sessions by outcome (``trained``, ``failed`` (raised), ``timeouts``,
    ``no_requests``, ``prompt_too_long``), ``requests/mean``, ``segments/mean`` and ``broken_sessions`` (sessions of
    several segments: a later prompt did not extend the earlier tokens, e.g. a chat template that re-renders or drops
    earlier turns), ``segment_rows`` (earlier segments trained as rows of their own), ``segments/prompt_too_long``
    (earlier segments not trained: prompt longer than ``data.max_prompt_length``), ``http_errors`` (answers of
    status >= 400 to its sessions)."""
    if "agent_stats" not in batch:
        return {}
    scoring = batch["scoring"] if "scoring" in batch else [True] * len(batch)
    stats = [s for s, scores in zip(batch["agent_stats"], scoring) if scores]
    counts = Counter(s["outcome"] for s in stats)
    requests, segments = [s["requests"] for s in stats], [s["segments"] for s in stats]
    sessions = max(len(stats), 1)
    http_errors = sum(s["http_errors"] for s in stats)
    return {"agent/trained": float(counts["trained"]), "agent/failed": float(counts["failed"]),
            "agent/timeouts": float(counts["timeout"]), "agent/no_requests": float(counts["no_requests"]),
            "agent/prompt_too_long": float(counts["prompt_too_long"]),
            "agent/requests/mean": sum(requests) / sessions, "agent/segments/mean": sum(segments) / sessions,
            "agent/broken_sessions": float(sum(count > 1 for count in segments)),
            "agent/segment_rows": float(sum(len(s["segment_requests"]) for s in stats)),
            "agent/segments/prompt_too_long": float(sum(s["segments_too_long"] for s in stats)),
            "agent/http_errors": float(http_errors)}


def segments_batch(prompts: Batch, segments: list[Optional[Segment]], prompt_length: int, response_length: int,
                   pad_id: int) -> Batch:
    """The trajectory batch of one segment per row of ``prompts`` (``easyrl.trainer.rollout``'s layout, ``P`` =
    ``prompt_length``, ``R`` = ``response_length`` tokens): each row's prompt replaced by its segment's (as vLLM
    rendered it), its response the segment's (cut at ``R``), ``token_versions`` ``(bsz, R)`` and, with routing replay,
    ``routed_experts``; a row whose segment is None keeps the data's prompt and an empty response. Raises
    ``ValueError`` for a segment prompt longer than ``P``."""
    prompt_rows = [segment.prompt_ids if segment is not None else list(raw)
                   for segment, raw in zip(segments, prompts["raw_prompt_ids"])]
    ids, mask = left_pad(prompt_rows, prompt_length, pad_id)
    rendered = Batch(prompts.tensors.clone(), dict(prompts.extras))
    rendered["prompts"], rendered["prompt_mask"] = ids, mask
    rendered["raw_prompt_ids"] = prompt_rows
    empty = Segment(prompt_ids=[], log_probs=[], versions=[])
    rows = [segment or empty for segment in segments]
    log_probs = None if any(row.log_probs is None for row in rows) else [row.log_probs for row in rows]
    batch = trajectory_batch(rendered, [row.response_ids for row in rows], response_length, pad_id,
                             log_probs, [row.response_mask for row in rows])
    batch["token_versions"] = right_pad([row.versions or [-1] * len(row.response_ids) for row in rows],
                                        response_length, -1, torch.long)[0]
    if any(routed is not None for row in rows for routed in row.routings):  # routing replay (R3)
        batch["routed_experts"] = turns_routing_batch(batch, [row.routings for row in rows],
                                                      [row.sequence for row in rows])
    return batch


class AgentRollout:
    """A ``Rollout`` of agent sessions (module docstring) on the ``workers``' engines: through ``stream`` (shared with
    other callers: split engines) or, None, a request stream of its own over colocated engines, woken before each
    rollout and put back to sleep after it."""

    engines = 1  # the request stream spreads any number of sessions itself

    def __init__(self, workers, config, tokenizer, pad_id: int, stream: Optional[Callable[[], RequestStream]] = None):
        from easyrl.trainer.agent_endpoint.server import AgentEndpoint
        from easyrl.trainer.agent_endpoint.stream import stream_sample

        agent = config.worker.rollout.agent
        self.workers, self.pad_id, self.tokenizer = workers, pad_id, tokenizer
        self.prompt_length, self.response_length = config.data.max_prompt_length, config.data.max_response_length
        self.timeout_s = agent.timeout_s
        self.fn = load_agent(agent.entry_point)
        self._shared = stream
        self._stream: Optional[RequestStream] = None
        self._pool = concurrent.futures.ThreadPoolExecutor(agent.max_sessions, thread_name_prefix="easyrl-agent")
        model = config.worker.actor.model
        self.endpoint = AgentEndpoint(
            model.tokenizer_path or model.model_path,
            stream_sample(self._requests, self.response_length, overrides_of=lambda session: session.data["overrides"]),
            served_model_name="policy", tool_call_parser=agent.tool_call_parser,
            chat_template=config.data.override_chat_template,
            max_model_len=self.prompt_length + self.response_length, trust_remote_code=model.trust_remote_code)
        self._started = False
        self.last_sessions: list[Any] = []  # the last rollout's sessions, in row order (their records: token-exact)

    def _requests(self) -> RequestStream:
        if self._shared is not None:
            return self._shared()
        if self._stream is None:
            self._stream = RequestStream(self.workers, slots=1)
        return self._stream

    def _run(self, task: dict[str, Any], session: Any) -> Any:
        """One agent session: the user's function with the session's URL and key."""
        return self.fn(task=task, base_url=session.base_url, api_key=session.api_key,
                       model=self.endpoint.served_model_name)

    def generate(self, prompts: Batch, overrides: Optional[dict[str, Any]]) -> tuple[Batch, float]:
        """See ``Rollout.generate`` (``overrides``: the sampling of every request of these sessions, whatever the
        agent asks for). One row per session, its last segment; adds ``agent_result`` (what each agent returned, None
        where it failed), ``agent_segments`` (its earlier segments that train, ``session_trajectory``) and
        ``agent_stats`` (its session's outcome, requests, segments, HTTP errors, the requests of its trained segments:
        ``agent_metrics``)."""
        if not self._started:
            self.endpoint.start()
            self._started = True
        reshard = 0.0
        if self._shared is None:  # colocated engines: woken (weights synced) for this rollout
            reshard = max(self.workers.run_all(FSDPWorker.wake_rollout))
            self._requests().slots = max(1, len(prompts) // self.workers.rollout_dp_size)
        columns = prompts["columns"] if "columns" in prompts else [{}] * len(prompts)
        tasks = [{**row, "ground_truth": truth} for row, truth in zip(columns, prompts["ground_truth"])]
        sessions = [self.endpoint.open_session(data={"task": task, "overrides": overrides}) for task in tasks]
        futures = [self._pool.submit(self._run, task, session) for task, session in zip(tasks, sessions)]
        try:
            done, _ = concurrent.futures.wait(futures, timeout=self.timeout_s)
        finally:
            for session in sessions:
                self.endpoint.close_session(session)
            if self._shared is None:
                if len(done) < len(futures) and self._stream is not None:  # late agents' requests: dropped
                    self._stream.close()
                    self._stream = None
                self.workers.run_all(FSDPWorker.sleep_rollout)
        outcomes, results, rows, earlier, too_long = [], [], [], [], []
        for i, (future, session) in enumerate(zip(futures, sessions)):
            outcome, result, segment, others, dropped = "trained", None, None, [], 0
            if future not in done:
                outcome = "timeout"
            elif future.exception() is not None:
                outcome = "failed"
                logger.warning("agent session %s (row %d of the step) raised %s: %s; it trains nothing",
                               session.id, i, type(future.exception()).__name__, future.exception())
            else:
                result = future.result()
                segment, others, dropped, why = session_trajectory(session.segments(), self.prompt_length)
                outcome = why or outcome
            outcomes.append(outcome)
            results.append(result)
            rows.append(segment)
            earlier.append(others)
            too_long.append(dropped)
        self.last_sessions = sessions
        batch = segments_batch(prompts, rows, self.prompt_length, self.response_length, self.pad_id)
        batch["agent_result"] = results
        batch["agent_segments"] = earlier  # rows of their own in the step (easyrl.trainer.session_rows)
        batch["agent_stats"] = [{"outcome": outcome, "requests": len(session.records),
                                 "segments": len(session.segments()), "http_errors": session.errors,
                                 "trained_requests": row.requests if row is not None else [],
                                 "segment_requests": [segment.requests for segment in others],
                                 "segments_too_long": dropped}
                                for outcome, session, row, others, dropped in zip(outcomes, sessions, rows, earlier,
                                                                                  too_long)]
        return batch, reshard

    def slot_occupancy(self) -> Optional[float]:
        """See ``Rollout.slot_occupancy``."""
        stream = self._shared() if self._shared is not None else self._stream
        return stream.slot_occupancy() if stream is not None else None

    def close(self) -> None:
        """Stop the endpoint, the agents' threads and the stream of its own."""
        if self._started:
            self.endpoint.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._stream is not None:
            self._stream.close()
