"""The rollout: what turns a batch of prompts into a batch of trajectories; the trainer does not know which kind.

A trajectory batch adds to the prompt batch (``prompts`` ``(bsz, P)`` left-padded, its ``prompt_mask``, the extras):

* ``responses`` ``(bsz, R)``: the generated tokens, right-padded to ``data.max_response_length`` (``R``);
* ``response_mask`` ``(bsz, R)``: 1 on the tokens the policy is trained on (every generated token in a single turn;
  a multi-turn rollout puts 0 on tool and environment tokens), 0 on padding;
* ``input_ids`` / ``attention_mask`` ``(bsz, P + R)``: prompt and response side by side;
* ``rollout_log_probs`` ``(bsz, R)``, with ``worker.rollout.calculate_log_probs``: the engine's log-probs of the
  sampled tokens.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import torch

from easyrl.batch import Batch
from easyrl.trainer.batch_layout import for_rollout, right_pad
from easyrl.workers.fsdp_worker import FSDPWorker

__all__ = ["Rollout", "SingleTurnRollout"]


class Rollout(Protocol):
    """Turns prompts into trajectories (see the module docstring)."""

    engines: int
    """Number of rollout engines; a batch of prompts must split evenly over them."""

    def generate(self, prompts: Batch, overrides: Optional[dict[str, Any]]) -> tuple[Batch, float]:
        """The trajectory batch of ``prompts`` (one trajectory per row), and the seconds spent bringing the
        engines' weights up to date before generating (``timing_s/reshard``).

        Args:
            prompts: a prompt batch (``Generator.prompt_batch``), ``len(prompts)`` a multiple of ``engines``.
            overrides: sampling settings replacing ``worker.rollout``'s (validation, greedy baselines), or None.
        """
        ...


class SingleTurnRollout:
    """One response per prompt from the ``workers``' vLLM engines, right-padded to ``response_length``."""

    def __init__(self, workers, response_length: int, pad_id: int):
        self.workers = workers
        self.response_length = response_length
        self.pad_id = pad_id

    @property
    def engines(self) -> int:
        """Number of vLLM engines (``world_size / worker.rollout.tensor_parallel_size``)."""
        return self.workers.rollout_dp_size

    def generate(self, prompts: Batch, overrides: Optional[dict[str, Any]]) -> tuple[Batch, float]:
        """See :meth:`Rollout.generate`."""
        # one result per engine; vLLM takes the images, not the processor outputs
        outputs = self.workers.run_rollout(FSDPWorker.generate_sequences, for_rollout(prompts), overrides=overrides)
        response_ids = [ids for out in outputs for ids in out["response_ids"]]
        responses, response_mask = right_pad(response_ids, self.response_length, self.pad_id, torch.long)
        batch = Batch(prompts.tensors.clone(), dict(prompts.extras))
        batch["responses"] = responses
        batch["response_mask"] = response_mask
        batch["input_ids"] = torch.cat([prompts["prompts"], responses], dim=1)
        batch["attention_mask"] = torch.cat([prompts["prompt_mask"], response_mask], dim=1)
        if outputs[0]["response_log_probs"] is not None:
            log_probs = [lp for out in outputs for lp in out["response_log_probs"]]
            batch["rollout_log_probs"] = right_pad(log_probs, self.response_length, 0.0, torch.float32)[0]
        return batch, max(out["timing_s/reshard"] for out in outputs)
