"""What the agent endpoint records of a session, and how a session's requests become trajectory segments.

Pure Python, no vLLM: the endpoint (``easyrl.trainer.agent_endpoint``) fills :class:`RequestRecord` s straight from
what the engine sampled and vLLM's renderer rendered; :func:`assemble_segments` turns a session's records into the
sequences the trainer trains (docs/agents.md, "Bring your agent").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["RequestRecord", "Segment", "assemble_segments"]


@dataclass
class RequestRecord:
    """One served request of an agent session, token-exact.

    ``prompt_ids``: the prompt as vLLM's renderer rendered it (chat template, tools) and the engine took it;
    ``response_ids``: the tokens the engine sampled that the agent was served (cut at a stop string or stop token as
    vLLM cuts them; EOS included when generation stopped on it); ``log_probs``: the engine's log-prob of each
    (behaviour log-probs, nats; None when the engine returned none); ``finish_reason``: ``"stop"``, ``"length"`` or
    ``"abort"``, as the API reported it; ``route``: the API path that served it (``/v1/chat/completions``, ...);
    ``index``: its order of arrival in the session (0, 1, ...); ``versions``: the engine's weight version that
    sampled each token (``RequestStream``'s token versions), when known; ``routed_experts``: with routing replay,
    the experts the engine's routers chose at each position it ran (``(positions, layers, top_k)``, prompt then
    response), else None."""

    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: Optional[list[float]]
    finish_reason: Optional[str]
    route: str = ""
    index: int = 0
    versions: Optional[list[int]] = None
    routed_experts: Any = None


@dataclass
class Segment:
    """One trainable sequence of a session: ``prompt_ids`` (the first request's prompt), then ``response_ids``: the
    sampled tokens of each request in it (``response_mask`` 1, their ``log_probs`` kept) and between two requests the
    tokens the next prompt added after the previous response (tool results, environment and chat-template tokens:
    mask 0, log-prob 0.0). ``log_probs`` is None when a request of it had none; ``versions`` the weight version of
    each sampled token (-1 on mask 0), None when a request of it had none. ``requests``: the
    :attr:`RequestRecord.index` of each request in it, in order; ``routings`` their ``routed_experts``."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: Optional[list[float]] = field(default_factory=list)
    versions: Optional[list[int]] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    routings: list[Any] = field(default_factory=list)
    finish_reason: Optional[str] = None
    """The last request's."""

    @property
    def sequence(self) -> list[int]:
        """``prompt_ids + response_ids``: what a request must start with to continue this segment."""
        return self.prompt_ids + self.response_ids

    @property
    def sampled_tokens(self) -> int:
        """Tokens of ``response_ids`` the engine sampled (mask 1)."""
        return sum(self.response_mask)

    def extend(self, record: RequestRecord) -> None:
        """Append ``record``, whose prompt starts with :attr:`sequence`: the rest of its prompt (mask 0), then its
        sampled tokens (mask 1). Raises ``ValueError`` when its prompt does not start with :attr:`sequence`."""
        start = len(self.prompt_ids) + len(self.response_ids)
        if not continues(self.sequence, record.prompt_ids):
            raise ValueError(f"request {record.index}'s prompt does not extend the segment's {start} tokens")
        gap = record.prompt_ids[start:]
        self._append(gap, 0, None, None)
        self._append(record.response_ids, 1, record.log_probs, record.versions)
        self.requests.append(record.index)
        self.routings.append(record.routed_experts)
        self.finish_reason = record.finish_reason

    def _append(self, ids: list[int], mask: int, log_probs: Optional[list[float]],
                versions: Optional[list[int]]) -> None:
        for name, values in (("log-probs", log_probs), ("versions", versions)):
            if mask and values is not None and len(values) != len(ids):
                raise ValueError(f"{len(ids)} sampled tokens but {len(values)} {name}")
        self.response_ids += ids
        self.response_mask += [mask] * len(ids)
        if self.log_probs is not None:
            self.log_probs = None if mask and log_probs is None else (
                self.log_probs + (list(log_probs) if mask else [0.0] * len(ids)))
        if self.versions is not None:
            self.versions = None if mask and versions is None else (
                self.versions + (list(versions) if mask else [-1] * len(ids)))


def continues(sequence: list[int], prompt_ids: list[int]) -> bool:
    """Whether ``prompt_ids`` starts with the whole of ``sequence`` (an equal one continues it too)."""
    return len(prompt_ids) >= len(sequence) and prompt_ids[: len(sequence)] == sequence


def assemble_segments(records: list[RequestRecord]) -> list[Segment]:
    """A session's requests, in order of arrival, as trajectory segments: a request whose prompt ids start with a
    segment's prompt + response so far continues that segment (the tokens in between are environment tokens, mask
    0); one that continues none starts a new segment (a re-tokenization break: the agent's framework re-rendered
    the conversation to other ids than those sampled, or it started a new conversation). Where several segments
    could take a request, the longest does (the most recent of equal ones), so a side conversation in between
    (a summary, a sub-agent) does not break the main one.

    Segments come in the order they started; each trains as its own sample sharing the session's reward (docs/
    agents.md). A request with no sampled tokens adds only its gap; a segment can hold no sampled token at all
    (``Segment.sampled_tokens`` 0). Raises ``ValueError`` when a record's log-probs or versions do not match its
    tokens."""
    segments: list[Segment] = []
    for record in records:
        best: Optional[Segment] = None
        for segment in reversed(segments):
            if continues(segment.sequence, record.prompt_ids) and (
                    best is None or len(segment.sequence) > len(best.sequence)):
                best = segment
        if best is None:
            best = Segment(list(record.prompt_ids))
            segments.append(best)
        best.extend(record)
    return segments
