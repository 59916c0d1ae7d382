"""Where a step's batch comes from (a part the trainer holds, chosen with the placement: ``easyrl.trainer.placement``):
``OnPolicyBatches`` generates it when the step starts, by the weights the step trains; the split placement's
``easyrl.trainer.async_rollout.AheadBatches`` takes it from chunks generated ahead."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional, Protocol

from easyrl.batch import Batch
from easyrl.trainer.generation import Generator

__all__ = ["BatchSource", "OnPolicyBatches"]


class BatchSource(Protocol):
    """A step's generated and scored batch, and what the trainer tells it around the step."""

    def next_batch(self, prompt_stream: Iterator[dict[str, list]], step: int, timing: dict[str, float],
                   metrics: dict[str, float]) -> tuple[Batch, Any, dict[str, list[float]], int]:
        """Step ``step``'s batch as ``Generator.make_batch`` returns it ``(batch, pending, scores, failures)``,
        adding its phases' seconds to ``timing`` and its metrics to ``metrics``."""
        ...

    def step_done(self, metrics: dict[str, float]) -> None:
        """The step that trained the batch is done (its ``metrics``, to which the source may add)."""
        ...

    def update_engines(self) -> float:
        """Make the engines hold the trainer's current weights now (before a validation); returns the seconds."""
        ...

    def prompt_position(self) -> Optional[dict[str, Any]]:
        """The prompt stream's state a checkpoint saves (None: the stream's own)."""
        ...

    def restart(self, global_step: int, prompt_position: Any) -> None:
        """Forget what was made for later steps: a resume at ``global_step``, prompts at ``prompt_position``."""
        ...

    def close(self) -> None:
        """Stop whatever runs in the background."""
        ...


class OnPolicyBatches:
    """Each step's batch generated when it starts (``generator.make_batch``) by the weights it trains; the colocated
    engines bring their weights up to date themselves before generating."""

    def __init__(self, generator: Generator):
        self.generator = generator

    def next_batch(self, prompt_stream: Iterator[dict[str, list]], step: int, timing: dict[str, float],
                   metrics: dict[str, float]) -> tuple[Batch, Any, dict[str, list[float]], int]:
        """See ``BatchSource.next_batch``."""
        return self.generator.make_batch(prompt_stream, step, timing, metrics)

    def step_done(self, metrics: dict[str, float]) -> None:
        """Nothing to do."""

    def update_engines(self) -> float:
        """0 s: the engines sync before they generate."""
        return 0.0

    def prompt_position(self) -> Optional[dict[str, Any]]:
        """None: the prompt stream's own position is the trained one."""
        return None

    def restart(self, global_step: int, prompt_position: Any) -> None:
        """Nothing was made ahead."""

    def close(self) -> None:
        """Nothing runs in the background."""
