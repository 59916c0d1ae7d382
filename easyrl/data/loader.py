"""The training prompts as an endless, resumable stream of batches, epoch after epoch.

Built on torchdata's ``StatefulDataLoader`` (its ``state_dict`` holds the position inside the epoch) and
``StatefulDistributedSampler`` with one replica (its order is a pure function of ``(seed, epoch)``), so that a run
resumed from a checkpoint draws exactly the batches the uninterrupted run would have drawn, also across an epoch
boundary. (A plain ``RandomSampler`` with a generator does not: torchdata restores the generator of the current
epoch, and the next epoch's order then differs.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler


class PromptStream:
    """Batches of ``batch_size`` prompts (``data.rollout_batch_size``); a short last batch of each epoch is dropped.
    ``shuffle`` reshuffles each epoch (order from ``seed`` and the epoch number).

    Raises:
        ValueError: fewer items than ``batch_size`` (no batch at all).
    """

    def __init__(self, dataset: Dataset, batch_size: int, shuffle: bool, seed: int, collate_fn: Callable):
        if len(dataset) < batch_size:
            raise ValueError(
                f"The training set has {len(dataset)} prompts, fewer than data.rollout_batch_size={batch_size}: "
                f"lower the batch size or add data."
            )
        self.sampler = StatefulDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=seed)
        self.loader = StatefulDataLoader(dataset, batch_size=batch_size, sampler=self.sampler, drop_last=True,
                                         collate_fn=collate_fn)
        self.epoch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        while True:
            self.sampler.set_epoch(self.epoch)
            yield from self.loader
            self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        """The position: epoch number and the loader's place inside it (take it between batches)."""
        return {"epoch": self.epoch, "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position of :meth:`state_dict` (before iterating)."""
        self.epoch = state["epoch"]
        self.loader.load_state_dict(state["loader"])
