"""The turn loop of a multi-turn rollout, engine-agnostic: trajectories as token ids (generated ids plus tokenized
tool/environment turns, never re-tokenized), the response mask (1 on assistant tokens), the engine's log-probs, and
the conversation and tool calls for the reward function. A trajectory ends at a final answer, ``max_assistant_turns``,
``max_user_turns`` or its ``budget`` of response tokens (a tool turn that does not fit is cut).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from easyrl.agents import scheduler
from easyrl.agents.chat import turn_ids
from easyrl.agents.environment import next_message
from easyrl.agents.executor import ToolExecutor
from easyrl.agents.parsers import Parser
from easyrl.agents.tool_images import ToolImages
from easyrl.errors import ConfigError

__all__ = ["Trajectory", "TurnLoop", "Generate"]

Generate = Callable[[list["Trajectory"], int], list[tuple[list[int], Optional[list[float]]]]]
"""``generate(trajectories, round) -> [(new ids, log-probs or None)]``: one turn each, ``turn_budget`` at most."""


@dataclass
class Trajectory:
    """One sample's conversation after its prompt."""

    prompt_ids: list[int]
    budget: int
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    done: bool = False
    prompt_images: int = 0
    images: list = field(default_factory=list)
    """Prepared tool images, in order; their pads are in ``response_ids``, expanded (``image_tokens`` each)."""
    image_tokens: list[int] = field(default_factory=list)
    tool_images: int = 0
    tool_images_dropped: int = 0

    @property
    def remaining(self) -> int:
        """Response tokens left in the budget."""
        return self.budget - len(self.response_ids)

    def add(self, ids: list[int], trained: bool, log_probs: Optional[list[float]] = None) -> None:
        """Append tokens cut to the budget (a cut ends it): assistant (``trained``, mask 1) or tool (mask 0)."""
        ids = list(ids)[: self.remaining]
        self.response_ids += ids
        self.response_mask += [int(trained)] * len(ids)
        self.log_probs += list(log_probs[: len(ids)]) if log_probs is not None else [0.0] * len(ids)
        if self.remaining <= 0:
            self.done = True

    def stats(self) -> dict[str, float]:
        """Per-trajectory counts for ``multi_turn/*`` metrics."""
        return {"assistant_turns": self.assistant_turns, "user_turns": self.user_turns,
                "tool_calls": len(self.tool_calls), "tool_errors": self.tool_errors,
                "tool_timeouts": self.tool_timeouts, "assistant_tokens": sum(self.response_mask),
                "tokens": len(self.response_ids), "tool_images": self.tool_images,
                "tool_images_dropped": self.tool_images_dropped}


class TurnLoop:
    """Runs trajectories to their end. ``executor`` None: every tool call is answered with an error; limits None:
    none; ``images`` None: a text-only model, where a tool image is an error (docs/errors.md A09)."""

    def __init__(self, tokenizer: Any, parser: Parser, executor: Optional[ToolExecutor],
                 environment: Optional[Callable] = None, max_assistant_turns: Optional[int] = None,
                 max_user_turns: Optional[int] = None, max_turn_tokens: Optional[int] = None,
                 images: Optional[ToolImages] = None):
        self.tokenizer = tokenizer
        self.parser = parser
        self.executor = executor
        self.environment = environment
        self.max_assistant_turns = max_assistant_turns
        self.max_user_turns = max_user_turns
        self.max_turn_tokens = max_turn_tokens
        self.images = images
        self._special_ids = set(tokenizer.all_special_ids)

    def turn_budget(self, traj: Trajectory) -> int:
        """Tokens the next assistant turn of ``traj`` may generate."""
        return traj.remaining if self.max_turn_tokens is None else min(traj.remaining, self.max_turn_tokens)

    def run(self, trajectories: list[Trajectory], generate: Generate,
            patience: float = scheduler.PATIENCE) -> list[Trajectory]:
        """Generate, call tools and step the environment until every trajectory is done."""
        return scheduler.run_turns(self, trajectories, generate, patience)

    def _assistant_turn(self, traj: Trajectory, ids: list[int], log_probs: Optional[list[float]]) -> None:
        traj.add(ids, trained=True, log_probs=log_probs)
        traj.assistant_turns += 1
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        traj.messages.append({"role": "assistant", "content": text})
        if not ids or (self.max_assistant_turns is not None and traj.assistant_turns >= self.max_assistant_turns):
            traj.done = True

    def _follow_up(self, traj: Trajectory, results: list) -> None:
        """Append the tool turn answering the last assistant turn's calls (``results`` in call order; a call without
        one is answered with an error), else the environment's turn, or end ``traj``."""
        calls, new_images = self.parser(traj.messages[-1]["content"]), 0
        if calls:
            messages, results = [], iter(results)
            for call in calls:
                result = next(results, None)
                content = result.content if result is not None else "Error: no tools are configured"
                status = result.status if result is not None else "error"
                traj.tool_calls.append({**call, "result": content, "status": status})
                traj.tool_errors += status == "error"
                traj.tool_timeouts += status == "timeout"
                images = result.images if result is not None else []
                if images and self.images is None:  # docs/errors.md A09
                    raise ConfigError(f"the tool {call.get('name')!r} returned {len(images)} image(s), but the model "
                                      "is text-only (it has no image processor): tools may return images only for "
                                      "Qwen-VL models (Qwen2.5-VL, Qwen3-VL); return text from the tool (a path or a "
                                      "caption) or train a VL model.")
                if images:
                    before = len(traj.images)
                    messages.append(self.images.attach(traj, content, images))
                    new_images += len(traj.images) - before
                else:
                    messages.append({"role": "tool", "content": content})
        elif self.environment is not None and (self.max_user_turns is None or traj.user_turns < self.max_user_turns):
            message = next_message(self.environment, traj.messages)
            if message is None:
                traj.done = True
                return
            traj.user_turns += 1
            messages = [message]
        else:
            traj.done = True
            return
        traj.messages.extend(messages)
        # the turn's end-of-turn token (a turn cut by max_turn_tokens ends on an ordinary one: none)
        last = traj.response_ids[-1]
        end_text = self.tokenizer.decode([last]) if last in self._special_ids else ""
        ids = turn_ids(self.tokenizer, messages, end_text)
        traj.add(self.images.expand(traj, ids, new_images) if new_images else ids, trained=False)
