"""The training prompts as an endless, resumable stream of batches: torchdata's ``StatefulDataLoader`` over a
one-replica ``StatefulDistributedSampler``, whose order is a function of ``(seed, epoch)`` (a ``RandomSampler``
would draw another order in the epoch after a resume)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler


class PromptStream:
    """Batches of ``batch_size`` prompts, the short last batch of an epoch dropped, reshuffled each epoch with
    ``shuffle``; ValueError for fewer items than ``batch_size``."""

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
