"""Where a step's batch comes from (a part the trainer holds, chosen with the placement: ``easyrl.trainer.placement``):
``OnPolicyBatches`` generates it when the step starts, by the weights the step trains; the split placement's
``easyrl.trainer.async_rollout.AheadBatches`` takes it from chunks generated ahead; a replay's ``ReplayBatches`` reads
it from a rollout dump (``trainer.load_rollout_data_dir``, docs/replay.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional, Protocol

from easyrl.batch import Batch
from easyrl.trainer.generation import Generator
from easyrl.trainer.metrics import timer
from easyrl.trainer.rollout_dump import read_step, replay_inputs, step_info

__all__ = ["BatchSource", "OnPolicyBatches", "ReplayBatches"]


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


class ReplayBatches:
    """Each step's batch read from the rollout dump in ``folder`` (``trainer.load_rollout_data_dir``): step ``step``
    trains the dumped step ``step``'s samples in their order, scored as they were (the judge's and reward model's
    scores included), less what the step computes again (``rollout_dump.RECOMPUTED``: log-probs, values, rewards with
    the KL, advantages). Nothing is generated: the prompt stream is not read, and the position a checkpoint saves is
    the dumped run's after that step."""

    def __init__(self, folder: str):
        self.folder = folder
        self.position: Optional[dict[str, Any]] = None  # the dumped run's prompt stream after the last replayed step

    def next_batch(self, prompt_stream: Iterator[dict[str, list]], step: int, timing: dict[str, float],
                   metrics: dict[str, float]) -> tuple[Batch, Any, dict[str, list[float]], int]:
        """See ``BatchSource.next_batch``: the dumped batch of ``step``, read in ``timing["replay"]``; no scoring
        pending, no scores beyond the batch's, the dumped run's count of reward failures (``reward/errors``).
        Raises ``RunStateError`` when the dump lacks the step."""
        with timer("replay", timing):
            info = step_info(self.folder, step)
            batch = replay_inputs(read_step(self.folder, step))
        self.position = info.get("prompt_position")
        return batch, None, {}, int(info.get("metrics", {}).get("reward/errors", 0))

    def step_done(self, metrics: dict[str, float]) -> None:
        """Nothing to do."""

    def update_engines(self) -> float:
        """0 s: there are no engines (a replay does not validate: ``easyrl.config.placement.check_replay``)."""
        return 0.0

    def prompt_position(self) -> Optional[dict[str, Any]]:
        """The dumped run's prompt-stream position after the last replayed step (None before the first, or when the
        dump did not record it: then the stream's own)."""
        return self.position

    def restart(self, global_step: int, prompt_position: Any) -> None:
        """Nothing was read ahead."""
        self.position = None

    def close(self) -> None:
        """Nothing runs in the background."""
