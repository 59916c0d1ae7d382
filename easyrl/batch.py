"""The batch that flows between phases: a ``TensorDict`` of per-sample tensors plus per-sample Python objects.

Tensors (all with leading dimension ``bsz``): ``prompts`` (bsz, prompt_len) left-padded, ``responses``
(bsz, resp_len) right-padded, ``input_ids`` / ``attention_mask`` (bsz, prompt_len + resp_len), ``response_mask``
(bsz, resp_len), and as phases run: ``old_log_probs``, ``ref_log_probs``, ``rollout_log_probs``,
``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns`` (each (bsz, resp_len)).
Extras: ``uid`` (group id shared by the samples of one prompt), ``ground_truth``, ``multi_modal_inputs``
(processor outputs such as ``pixel_values``), ``images``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict


@dataclass
class Batch:
    """``tensors``: a TensorDict with ``batch_size=[bsz]``; ``extras``: name -> list of ``bsz`` Python objects."""

    tensors: TensorDict
    extras: dict[str, list[Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.tensors.batch_size[0])

    def __getitem__(self, key: str) -> Any:
        return self.tensors[key] if key in self.tensors.keys() else self.extras[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors.keys() or key in self.extras

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.tensors[key] = value
        else:
            if len(value) != len(self):
                raise ValueError(f"Extra '{key}' has {len(value)} entries for a batch of {len(self)}.")
            self.extras[key] = list(value)

    def select(self, indices: list[int] | torch.Tensor) -> "Batch":
        """The samples at ``indices``, in that order."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        return Batch(self.tensors[idx], {k: [v[i] for i in idx.tolist()] for k, v in self.extras.items()})

    def without(self, *keys: str) -> "Batch":
        """The same samples less the tensors ``keys`` (absent ones ignored; the rest shared, not copied)."""
        return Batch(self.tensors.exclude(*keys), self.extras)

    def split(self, size: int) -> list["Batch"]:
        """Consecutive pieces of ``size`` samples (the last one may be shorter)."""
        return [self.select(list(range(s, min(s + size, len(self))))) for s in range(0, len(self), size)]

    def chunk(self, n: int) -> list["Batch"]:
        """``n`` equal consecutive pieces. Raises ValueError if ``len(self)`` is not divisible by ``n``."""
        if len(self) % n != 0:
            raise ValueError(f"A batch of {len(self)} samples cannot be split into {n} equal parts.")
        return self.split(len(self) // n)

    def padded_to_multiple(self, k: int) -> "Batch":
        """This batch with ``(-bsz) % k`` copies of its first samples appended (wrapping around), so that ``k``
        workers get equal shares; ``self`` itself when nothing is to add. ValueError for ``k < 1``."""
        if k < 1:
            raise ValueError(f"Cannot pad a batch to a multiple of {k}: it must be at least 1.")
        real = len(self)
        pad = (-real) % k
        return Batch.cat([self, self.select([i % real for i in range(pad)])]) if pad else self

    @staticmethod
    def cat(batches: list["Batch"]) -> "Batch":
        """Concatenate along the sample dimension (same keys in every piece)."""
        tensors = torch.cat([b.tensors for b in batches], dim=0)
        extras = {k: [x for b in batches for x in b.extras[k]] for k in batches[0].extras}
        return Batch(tensors, extras)
