"""Multi-modal inputs shipped to a worker once per step, not once per phase.

Processor outputs (``multi_modal_inputs``) are a VL batch's largest part. After balancing, the trainer stages each
share's inputs on its worker (``stage``, tagged with one ``(step token, index)`` reference per sample); the later
passes send the references instead, and ``attach`` puts the staged inputs back, refusing a share whose references
differ rather than using stale images. ``release`` frees them at the end of the step.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

import torch
from tensordict import TensorDict

from easyrl.batch import Batch

__all__ = ["STAGE_KEY", "MultiModalStage", "has_multi_modal", "multi_modal_nbytes", "stage_references",
           "staging_batch"]

STAGE_KEY = "multi_modal_stage"  # extras key of the per-sample references sent in place of multi_modal_inputs


def has_multi_modal(batch: Batch) -> bool:
    """Whether any sample of ``batch`` has processor outputs (a text-only batch stages nothing)."""
    return any(batch.extras.get("multi_modal_inputs", []))


def multi_modal_nbytes(inputs: list[dict[str, torch.Tensor]]) -> int:
    """Bytes of the tensors in per-sample processor outputs (summed per sample, shared tensors counted each time)."""
    return sum(value.numel() * value.element_size() for sample in inputs for value in (sample or {}).values()
               if isinstance(value, torch.Tensor))


def stage_references(size: int, token: Optional[str] = None) -> list[tuple[str, int]]:
    """One reference per sample of a balanced batch of ``size`` samples: ``(token, index)``, ``token`` new per step
    (a random hex string unless given)."""
    token = token or uuid.uuid4().hex
    return [(token, index) for index in range(size)]


def staging_batch(batch: Batch, references: list[tuple[str, int]]) -> Batch:
    """What ``stage`` needs of ``batch`` (bsz samples): no tensors, its ``multi_modal_inputs`` and the references."""
    return Batch(TensorDict({}, batch_size=[len(batch)]),
                 {"multi_modal_inputs": batch["multi_modal_inputs"], STAGE_KEY: references})


class MultiModalStage:
    """One worker's staged multi-modal inputs, and the bytes of them it received since the last ``release``."""

    def __init__(self) -> None:
        self.references: Optional[list[tuple[str, int]]] = None
        self.inputs: Optional[list[dict[str, Any]]] = None
        self.bytes_received = 0

    def stage(self, share: Batch) -> None:
        """Keep ``share``'s ``multi_modal_inputs`` under its ``STAGE_KEY`` references (replacing any earlier ones)."""
        self.references = list(share[STAGE_KEY])
        self.inputs = list(share["multi_modal_inputs"])
        self.bytes_received += multi_modal_nbytes(self.inputs)

    def count(self, data: Batch) -> None:
        """Add the bytes of the ``multi_modal_inputs`` that ``data`` carries (if any) to ``bytes_received``."""
        self.bytes_received += multi_modal_nbytes(data.extras.get("multi_modal_inputs", []))

    def attach(self, share: Batch) -> Batch:
        """``share`` with its multi-modal inputs: the staged ones when it carries ``STAGE_KEY`` references, else
        ``share`` as it came. Raises ``RuntimeError`` for references but nothing staged, or references of another
        step, count or order."""
        if STAGE_KEY not in share.extras:
            self.count(share)
            return share
        sent = list(share[STAGE_KEY])
        if self.references is None:
            raise RuntimeError(f"A share of {len(sent)} samples refers to staged multi-modal inputs, but none are "
                               "staged on this worker: stage_multi_modal must run after balancing and before the "
                               "passes of the step (and release_multi_modal only after them).")
        if sent != self.references:
            tokens = sorted({token for token, _ in sent})
            staged_token = self.references[0][0] if self.references else None
            if staged_token not in tokens:
                what = f"another step's (staged token {staged_token}, the share's {tokens})"
            elif len(sent) != len(self.references):
                what = f"for {len(self.references)} samples but the share has {len(sent)}"
            else:
                what = "for other samples of this step (another share, or another order)"
            raise RuntimeError(f"The multi-modal inputs staged on this worker are {what}: refusing to use stale "
                               "images. A share must go to the worker it was staged on, in the order it was staged, "
                               "within the same step.")
        extras = {key: value for key, value in share.extras.items() if key != STAGE_KEY}
        extras["multi_modal_inputs"] = self.inputs
        return Batch(share.tensors, extras)

    def release(self) -> int:
        """Drop the staged inputs; returns the bytes of multi-modal inputs received since the last release."""
        received = self.bytes_received
        self.references, self.inputs, self.bytes_received = None, None, 0
        return received

