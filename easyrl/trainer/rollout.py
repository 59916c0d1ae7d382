"""The trainer's padded batch layout, and the rollout: prompts -> trajectories (the trainer does not know which kind).

A prompt batch holds ``prompts`` ``(bsz, P)`` left-padded (``P``: ``data.max_prompt_length``), its ``prompt_mask`` and
the extras; a trajectory batch adds:

* ``responses`` ``(bsz, R)``: the generated tokens, right-padded to ``data.max_response_length`` (``R``), so every
  response starts at column ``P`` of ``input_ids``;
* ``response_mask`` ``(bsz, R)``: 1 on the tokens the policy is trained on (every generated token in a single turn;
  a multi-turn rollout puts 0 on tool and environment tokens), 0 on padding;
* ``input_ids`` / ``attention_mask`` ``(bsz, P + R)``: prompt and response side by side;
* ``rollout_log_probs`` ``(bsz, R)``, with ``worker.rollout.calculate_log_probs``: the engine's log-probs of the
  sampled tokens;
* ``routed_experts`` ``(bsz, P + R, layers, top_k)`` int16, with routing replay (``worker.actor.router_replay``): the
  experts the engine's routers chose for each token, laid out as ``input_ids``; ``-1`` at padding and where the
  engine ran no forward (the last response token, a prefix served from its cache).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import numpy as np
import torch

from easyrl.batch import Batch
from easyrl.models.router_replay import NO_EXPERT
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.mm_staging import STAGE_KEY

__all__ = ["Rollout", "SingleTurnRollout", "for_rollout", "for_workers", "left_pad", "right_pad", "trajectory_batch",
           "routing_batch", "trajectory_routing", "turns_routing_batch"]


def left_pad(rows: list[list[int]], length: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows right-aligned in ``(len(rows), length)`` long tensors: ``(ids, mask)``, padding ``pad_id`` / 0 on
    the left; ``ValueError`` for a row longer than ``length``."""
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row) > length:
            raise ValueError(f"A prompt of {len(row)} tokens exceeds data.max_prompt_length={length}.")
        if row:
            ids[i, length - len(row):] = torch.tensor(row)
            mask[i, length - len(row):] = 1
    return ids, mask


def right_pad(rows: list[list[Any]], length: int, pad_value: Any,
              dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows left-aligned in ``(len(rows), length)``: ``(values of dtype, long mask)``, ``pad_value`` / 0 on the right;
    rows longer than ``length`` are cut."""
    values = torch.full((len(rows), length), pad_value, dtype=dtype)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        row = row[:length]
        if row:
            values[i, : len(row)] = torch.tensor(row, dtype=dtype)
            mask[i, : len(row)] = 1
    return values, mask


def trajectory_batch(prompts: Batch, response_ids: list[list[int]], length: int, pad_id: int,
                     log_probs: Optional[list[list[float]]] = None,
                     response_mask: Optional[list[list[int]]] = None) -> Batch:
    """The trajectory batch of ``prompts`` (a copy) with one response per row, laid out as the module docstring says;
    ``response_mask`` None: every generated token is trained on."""
    responses, valid = right_pad(response_ids, length, pad_id, torch.long)
    batch = Batch(prompts.tensors.clone(), dict(prompts.extras))
    batch["responses"] = responses
    batch["response_mask"] = valid if response_mask is None else right_pad(response_mask, length, 0, torch.long)[0]
    batch["input_ids"] = torch.cat([prompts["prompts"], responses], dim=1)
    batch["attention_mask"] = torch.cat([prompts["prompt_mask"], valid], dim=1)
    if log_probs is not None:
        batch["rollout_log_probs"] = right_pad(log_probs, length, 0.0, torch.float32)[0]
    return batch


def routing_batch(prompt_mask: torch.Tensor, response_length: int, routed: list[Any]) -> torch.Tensor:
    """The ``routed_experts`` tensor ``(bsz, P + R, layers, top_k)`` int16 (``-1`` where none) of one engine routing
    per sample, ``(positions, layers, top_k)`` over its prompt (``prompt_mask`` ``(bsz, P)``'s real tokens, the
    prompt as the engine ran it, image pads expanded) then its response (cut at ``response_length`` = R). Raises
    ``ValueError`` when a sample's routing has no row for some prompt token (engine and trainer saw other prompts)."""
    bsz, width = prompt_mask.shape
    shapes = [r.shape[1:] for r in routed if r is not None]
    if not shapes:
        raise ValueError("routing replay: the engines reported no routing for any sample")
    shape = shapes[0]
    out = torch.full((bsz, width + response_length, *shape), NO_EXPERT, dtype=torch.int16)
    for i, rows in enumerate(routed):
        if rows is None:
            continue
        prompt = int(prompt_mask[i].sum())
        if len(rows) < prompt:
            raise ValueError(f"sample {i}: the engine's routing covers {len(rows)} positions, its prompt has "
                             f"{prompt} tokens")
        rows = torch.from_numpy(rows[: prompt + response_length].astype("int16"))
        out[i, width - prompt: width - prompt + len(rows)] = rows
    return out


def trajectory_routing(turns: list[Any], positions: int) -> Optional[np.ndarray]:
    """One trajectory's engine routing ``(positions, layers, top_k)`` (``-1`` where none) from its turns' requests,
    in order, each ``(its prompt + response positions, layers, top_k)`` (the prompt of a turn: the trajectory so
    far): a position's experts are those of the first turn whose request ran it (a later turn's request re-runs
    it only when the engine's prefix cache dropped it). None without any turn's routing."""
    turns = [np.asarray(rows) for rows in turns if rows is not None]
    if not turns:
        return None
    out = np.full((positions, *turns[0].shape[1:]), NO_EXPERT, dtype=np.int16)
    for rows in turns:
        n = min(len(rows), positions)
        fill = (out[:n] == NO_EXPERT).all(axis=(1, 2)) & (rows[:n] != NO_EXPERT).all(axis=(1, 2))
        out[:n][fill] = rows[:n][fill]
    return out


def turns_routing_batch(batch: Batch, turns: list[list[Any]], sequences: list[list[int]]) -> torch.Tensor:
    """The ``routed_experts`` of a batch of multi-request trajectories (multi-turn, agent sessions): each sample's
    ``turns`` (its requests' engine routing, in order, None where none) merged over its ``sequences`` (prompt +
    response ids, :func:`trajectory_routing`), laid out as ``batch``'s ``input_ids`` (:func:`routing_batch`), and
    ``-1`` on the response tokens the policy is not trained on (``response_mask`` 0: tool, environment and
    chat-template tokens keep the actor's own routing)."""
    merged = [trajectory_routing(rows, len(sequence)) for rows, sequence in zip(turns, sequences)]
    routed = routing_batch(batch["prompt_mask"], batch["response_mask"].shape[1], merged)
    routed[:, batch["prompt_mask"].shape[1]:][batch["response_mask"] == 0] = NO_EXPERT
    return routed


def for_workers(batch: Batch, staged: Optional[list[tuple[str, int]]] = None) -> Batch:
    """The tensors and processor outputs (no copy), the log-prob and update passes' share; with ``staged`` (one
    reference per sample, ``easyrl.workers.mm_staging``) the references replace the processor outputs."""
    if staged is not None:
        return Batch(batch.tensors, {STAGE_KEY: staged})
    extras = {key: batch.extras[key] for key in ("multi_modal_inputs",) if key in batch.extras}
    return Batch(batch.tensors, extras)


def data_sources(batch: Batch) -> list[Any]:
    """Each sample's ``data_source`` column (``(bsz,)``; None where its row has none): what routes a sample to its
    distillation teacher (``easyrl.config.actor.route_teachers``)."""
    columns = batch["columns"] if "columns" in batch else [{}] * len(batch)
    return [(row or {}).get("data_source") for row in columns]


def for_rollout(prompts: Batch) -> Batch:
    """A prompt batch less ``multi_modal_inputs`` (vLLM takes the images) and ``columns`` (no copy)."""
    return Batch(prompts.tensors, {key: value for key, value in prompts.extras.items()
                                   if key not in ("multi_modal_inputs", "columns")})


class Rollout(Protocol):
    """Turns prompts into trajectories (see the module docstring)."""

    engines: int
    """Number of rollout engines; a batch of prompts must split evenly over them."""

    def generate(self, prompts: Batch, overrides: Optional[dict[str, Any]]) -> tuple[Batch, float]:
        """The trajectory batch of ``prompts`` (one trajectory per row), and the seconds spent bringing the
        engines' weights up to date (``timing_s/reshard``); ``len(prompts)`` a multiple of ``engines``,
        ``overrides`` sampling settings replacing ``worker.rollout``'s, or None."""
        ...

    def slot_occupancy(self) -> Optional[float]:
        """The share of the engines' decode slots (a generation call's samples per engine) that held a sequence over
        the engine steps since the last call (``rollout/slot_occupancy``); None when not measured."""
        ...

    def close(self) -> None:
        """Stop what it runs in the background (a request stream, tool processes, an agent endpoint); the trainer
        calls it once, at its end (``RayPPOTrainer.close``)."""
        ...


class SingleTurnRollout:
    """One response per prompt from the ``workers``' vLLM engines, right-padded to ``response_length``."""

    def __init__(self, workers, response_length: int, pad_id: int):
        self.workers = workers
        self.response_length = response_length
        self.pad_id = pad_id
        self._slots = [0, 0]  # decode slots held, offered since the last slot_occupancy()

    @property
    def engines(self) -> int:
        """Number of vLLM engines (``world_size / worker.rollout.tensor_parallel_size``)."""
        return self.workers.rollout_dp_size

    def generate(self, prompts: Batch, overrides: Optional[dict[str, Any]]) -> tuple[Batch, float]:
        """See :meth:`Rollout.generate`."""
        # one result per engine; vLLM takes the images, not the processor outputs
        outputs = self.workers.run_rollout(FSDPWorker.generate_sequences, for_rollout(prompts), overrides=overrides)
        log_probs = None
        if outputs[0]["response_log_probs"] is not None:
            log_probs = [lp for out in outputs for lp in out["response_log_probs"]]
        batch = trajectory_batch(prompts, [ids for out in outputs for ids in out["response_ids"]],
                                 self.response_length, self.pad_id, log_probs)
        if outputs[0].get("routed_experts") is not None:  # routing replay: the engines' experts per token
            batch["routed_experts"] = routing_batch(prompts["prompt_mask"], self.response_length,
                                                    [r for out in outputs for r in out["routed_experts"]])
        for out in outputs:
            self._slots = [self._slots[0] + out["busy"], self._slots[1] + out["offered"]]
        return batch, max(out["timing_s/reshard"] for out in outputs)

    def slot_occupancy(self) -> Optional[float]:
        """See :meth:`Rollout.slot_occupancy`."""
        (busy, offered), self._slots = self._slots, [0, 0]
        return busy / offered if offered else None

    def close(self) -> None:
        """Nothing runs in the background."""
