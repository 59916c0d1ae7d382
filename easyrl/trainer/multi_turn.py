"""The multi-turn rollout (``worker.rollout.multi_turn.enable``; docs/agents.md): the driver runs the turns
(``easyrl.agents.trajectory.TurnLoop``), each round sending every ready trajectory to the workers' engines, which stay
awake between rounds. Beyond the layout of ``easyrl.trainer.rollout`` the batch holds ``messages``, ``tool_calls``,
``multi_turn_stats`` and, for a VL model, ``tool_images``: each resized as a prompt image, its processor outputs
appended to the prompt's ``multi_modal_inputs`` in the order of the image pads. With routing replay its
``routed_experts`` hold the engines' experts of the prompt and the assistant tokens; tool and environment tokens
keep the actor's own routing (``-1``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import torch
from PIL import Image

from easyrl.agents.environment import load_environment
from easyrl.agents.executor import ToolExecutor
from easyrl.agents.parsers import load_parser
from easyrl.agents.tool_images import ToolImages, collapse_pads
from easyrl.agents.tools import load_tools
from easyrl.agents import scheduler
from easyrl.agents.trajectory import Trajectory, TurnLoop
from easyrl.batch import Batch
from easyrl.data.images import process_image
from easyrl.trainer.request_stream import RequestStream
from easyrl.trainer.rollout import SingleTurnRollout, right_pad, trajectory_batch, turns_routing_batch
from easyrl.workers.fsdp_worker import FSDPWorker

__all__ = ["MultiTurnRollout", "VLToolImages", "make_rollout", "multi_turn_metrics", "token_versions",
           "tool_images_for"]

_SEED_STRIDE = 1_000_003  # per turn, so that a sample's turns draw from different streams


IMAGE_KEYS = ("pixel_values", "image_grid_thw")


class VLToolImages(ToolImages):
    """``ToolImages`` of a Qwen-VL ``processor`` within the dataset's pixel bounds and patch ``factor``, at most
    ``limit`` images (``worker.rollout.limit_images``)."""

    def __init__(self, processor: Any, min_pixels: int, max_pixels: int, factor: int, limit: int):
        self.processor = processor
        self.bounds = (min_pixels, max_pixels, factor)
        pad_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
        super().__init__(self._prepare, int(pad_id), limit)

    def _prepare(self, image: Image.Image) -> tuple[Image.Image, int]:
        """The image at its target size and its number of image tokens (both sides are multiples of ``factor``)."""
        image = process_image(image, *self.bounds)
        return image, image.width * image.height // self.bounds[2] ** 2

    def actor_inputs(self, prompt_inputs: dict[str, torch.Tensor], images: list[Image.Image]
                     ) -> dict[str, torch.Tensor]:
        """The prompt's processor outputs with ``images``' appended (``prompt_inputs`` itself when there are none)."""
        if not images:
            return prompt_inputs
        tool = self.processor.image_processor(images=images, return_tensors="pt")
        merged = dict(prompt_inputs)
        for key in IMAGE_KEYS:
            merged[key] = torch.cat([prompt_inputs[key], tool[key]]) if key in prompt_inputs else tool[key]
        return merged


def tool_images_for(dataset: Any, limit: int) -> Optional[VLToolImages]:
    """Tool images for the model of ``dataset`` (an ``RLDataset``); None for a text-only model."""
    processor = getattr(dataset, "processor", None)
    if processor is None or getattr(processor, "image_processor", None) is None:
        return None
    return VLToolImages(processor, dataset.min_pixels, dataset.max_pixels, dataset.factor, limit)


class MultiTurnRollout:
    """A ``Rollout`` of multi-turn trajectories; ``tokenizer``'s chat template renders the tool turns, ``images``: a VL
    model's tool images (None: text-only). ``stream``: the request stream the turns go to, shared with other callers
    (split engines, which keep their device and receive their weights); None: one of its own over the ``workers``'
    colocated engines, woken (weights synced) before each rollout and put back to sleep after it. ``ConfigError``
    for a tool, parser or environment that cannot be loaded."""

    def __init__(self, workers, config, tokenizer, pad_id: int, images=None,
                 stream: Optional[Callable[[], RequestStream]] = None):
        mt = config.worker.rollout.multi_turn
        self.workers = workers
        self.response_length = config.data.max_response_length
        self.pad_id = pad_id
        self.calculate_log_probs = config.worker.rollout.calculate_log_probs
        self.tools = load_tools(mt.tools)
        self.executor = ToolExecutor({name: tool.spec for name, tool in self.tools.items()}, mt.tool_timeout_s,
                                     mt.num_tool_workers, mt.max_tool_response_length) if self.tools else None
        self.loop = TurnLoop(tokenizer, load_parser(mt.format), self.executor, load_environment(mt.environment),
                             mt.max_assistant_turns, mt.max_user_turns, mt.max_turn_tokens, images=images)
        self.images = images
        self.patience = mt.patience  # easyrl.agents.scheduler; inf: every round waits for its slowest tool
        self._slots = [0, 0]  # decode slots held, offered since the last slot_occupancy() (rounds)
        self._shared = stream
        self._stream: Optional[RequestStream] = None  # by request, colocated: the engines' stream, made when needed

    @property
    def engines(self) -> int:
        """Number of vLLM engines (1 on a shared stream: it spreads any number of trajectories itself)."""
        return 1 if self._shared is not None else self.workers.rollout_dp_size

    def _turn_batch(self, prompts: Batch, trajectories: list[Trajectory], rows: list[int],
                    budgets: list[int]) -> Batch:
        """The next assistant turn of ``trajectories[i]`` for each ``i`` in ``rows`` (repeats allowed), as the
        engines take it: the prompt and the trajectory so far (one pad per tool image), its images, ``budgets``
        tokens at most, the turn's seed."""
        share = Batch(prompts.tensors[torch.tensor(rows)], {})
        share["uid"] = [str(i) for i in rows]  # a request stream places each trajectory on its own
        share["raw_prompt_ids"] = [trajectories[i].prompt_ids + (  # one pad per tool image, as the engine takes it
            collapse_pads(trajectories[i].response_ids, self.images.pad_id) if trajectories[i].images
            else trajectories[i].response_ids) for i in rows]
        share["images"] = [(prompts["images"][i] if "images" in prompts else []) + trajectories[i].images
                           for i in rows]
        if "videos" in prompts:
            share["videos"] = [prompts["videos"][i] for i in rows]
        share["max_tokens"] = budgets
        if "rollout_seed" in prompts:
            # the turn's number, not the round's: a turn samples the same whichever round it rides in
            share["rollout_seed"] = [(prompts["rollout_seed"][i] + _SEED_STRIDE * trajectories[i].assistant_turns)
                                     % 2**31 for i in rows]
        return share

    def _generate_round(self, prompts: Batch, trajectories: list[Trajectory], active: list[Trajectory],
                        round_: int, overrides: Optional[dict[str, Any]], reshard: list[float],
                        routings: list[list[Any]]):
        """One assistant turn of every ``active`` trajectory, in one batch over the engines (padded to a multiple
        of ``engines`` with one-token copies whose output is dropped); each turn's engine routing (routing replay)
        is appended to its trajectory's ``routings``."""
        index = {id(t): i for i, t in enumerate(trajectories)}
        rows = [index[id(t)] for t in active]
        pad = (-len(rows)) % self.engines
        rows_padded = rows + [rows[i % len(rows)] for i in range(pad)]
        share = self._turn_batch(prompts, trajectories, rows_padded,
                                 [self.loop.turn_budget(t) for t in active] + [1] * pad)
        outputs = self.workers.run_rollout(FSDPWorker.generate_sequences, share, overrides=overrides,
                                           keep_awake=True)
        reshard[0] += max(out["timing_s/reshard"] for out in outputs)
        for out in outputs:
            self._slots = [self._slots[0] + out["busy"], self._slots[1] + out["offered"]]
        ids = [row for out in outputs for row in out["response_ids"]][: len(active)]
        if outputs[0].get("routed_experts") is not None:
            for row, routed in zip(rows, [r for out in outputs for r in out["routed_experts"]]):
                routings[row].append(routed)
        if outputs[0]["response_log_probs"] is None:
            return [(row, None) for row in ids]
        log_probs = [row for out in outputs for row in out["response_log_probs"]][: len(active)]
        return list(zip(ids, log_probs))

    def generate(self, prompts: Batch, overrides: Optional[dict[str, Any]]) -> tuple[Batch, float]:
        """See ``Rollout.generate``."""
        trajectories = [Trajectory(list(ids), self.response_length) for ids in prompts["raw_prompt_ids"]]
        for traj, images in zip(trajectories, prompts["images"] if "images" in prompts else []):
            traj.prompt_images = len(images)
        reshard = [0.0]
        versions: Optional[list[list[int]]] = None
        routings: list[list[Any]] = [[] for _ in trajectories]  # per trajectory, its turns' engine routing
        if self._shared is not None:  # split engines: nothing to wake or put to sleep; weights change in flight
            versions = self._run_by_request(prompts, trajectories, overrides, routings)
        else:
            try:
                if self.patience is None:  # each trajectory on its own, request by request
                    reshard[0] = max(self.workers.run_all(FSDPWorker.wake_rollout))
                    self._run_by_request(prompts, trajectories, overrides, routings)
                else:
                    self.loop.run(trajectories, lambda active, round_: self._generate_round(
                        prompts, trajectories, active, round_, overrides, reshard, routings), self.patience)
            finally:
                self.workers.run_all(FSDPWorker.sleep_rollout)
        log_probs = [t.log_probs for t in trajectories] if self.calculate_log_probs else None
        batch = trajectory_batch(prompts, [t.response_ids for t in trajectories], self.response_length, self.pad_id,
                                 log_probs, [t.response_mask for t in trajectories])
        batch["messages"] = [t.messages for t in trajectories]
        batch["tool_calls"] = [t.tool_calls for t in trajectories]
        batch["multi_turn_stats"] = [t.stats() for t in trajectories]
        if any(routings):  # routing replay: the assistant tokens' experts; tool tokens keep the actor's own
            batch["routed_experts"] = turns_routing_batch(batch, routings,
                                                          [t.prompt_ids + t.response_ids for t in trajectories])
        if versions is not None:  # each trained token's weight version, -1 on tool and environment tokens
            batch["token_versions"] = right_pad([token_versions(t.response_mask, v) for t, v in
                                                 zip(trajectories, versions)], self.response_length, -1,
                                                torch.long)[0]
        if self.images is not None:  # a VL model: the keys are there whether or not a tool returned images (Batch.cat)
            batch["tool_images"] = [t.images for t in trajectories]  # as the engine got them, after the prompt's
            prompt_inputs = prompts["multi_modal_inputs"] if "multi_modal_inputs" in prompts else [{}] * len(prompts)
            batch["multi_modal_inputs"] = [self.images.actor_inputs(inputs, t.images)
                                           for inputs, t in zip(prompt_inputs, trajectories)]
        return batch, reshard[0]

    def _run_by_request(self, prompts: Batch, trajectories: list[Trajectory], overrides: Optional[dict[str, Any]],
                        routings: list[list[Any]]) -> list[list[int]]:
        """``scheduler.run_requests`` over the engines' request stream (one submission per assistant turn; the
        decode slots counted on a stream of its own: the trajectories per engine). Returns each trajectory's
        assistant tokens' weight versions, in order; appends each turn's engine routing to ``routings``."""
        if self._shared is not None:
            stream = self._shared()
        else:
            if self._stream is None:
                self._stream = RequestStream(self.workers, slots=1)
            stream = self._stream
            stream.slots = max(1, -(-len(trajectories) // self.engines))
        index = {id(t): i for i, t in enumerate(trajectories)}
        owner: dict[int, int] = {}  # submission -> trajectory
        versions: list[list[int]] = [[] for _ in trajectories]

        def submit(traj: Trajectory) -> int:
            i = index[id(traj)]
            sid = stream.submit(self._turn_batch(prompts, trajectories, [i], [self.loop.turn_budget(traj)]),
                                overrides)
            owner[sid] = i
            return sid

        def collect(handles: list[int], timeout: Optional[float]) -> dict[int, tuple[list[int], Any]]:
            done = stream.collect(handles, timeout)
            for sid, [(_, _, turn_versions, routed)] in done.items():
                i = owner.pop(sid)
                versions[i] += turn_versions
                if routed is not None:
                    routings[i].append(routed)
            return {sid: (ids, log_probs if self.calculate_log_probs else None)
                    for sid, [(ids, log_probs, _, _)] in done.items()}

        scheduler.run_requests(self.loop, trajectories, submit, collect)
        return versions

    def slot_occupancy(self) -> Optional[float]:
        """See ``Rollout.slot_occupancy`` (rounds: each round's turns count as one generation call)."""
        (busy, offered), self._slots = self._slots, [0, 0]
        stream = self._shared() if self._shared is not None else self._stream
        if stream is not None:
            measured = stream.take_slot_counts()
            busy, offered = busy + measured[0], offered + measured[1]
        return busy / offered if offered else None

    def close(self) -> None:
        """Stop the tool processes and the request stream."""
        if self.executor is not None:
            self.executor.close()
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def token_versions(response_mask: list[int], versions: list[int]) -> list[int]:
    """The weight version of each response token: the trained ones' (mask 1) from ``versions`` in order (the
    assistant turns' tokens, of which the budget may have cut the last), -1 on the others."""
    trained = iter(versions)
    return [next(trained, -1) if kept else -1 for kept in response_mask]


def make_rollout(config, workers, tokenizer, pad_id: int, dataset=None,
                 stream: Optional[Callable[[], RequestStream]] = None):
    """``AgentRollout`` with ``worker.rollout.agent.entry_point``, ``MultiTurnRollout`` with
    ``worker.rollout.multi_turn.enable`` (tool images by ``dataset``'s VL processor), else ``SingleTurnRollout``;
    ``stream``: the request stream they share (see ``MultiTurnRollout``)."""
    if config.worker.rollout.agent.enabled:
        from easyrl.trainer.agent_rollout import AgentRollout  # vLLM's serving layer: imported only for an agent

        return AgentRollout(workers, config, tokenizer, pad_id, stream)
    if config.worker.rollout.multi_turn.enable:
        images = tool_images_for(dataset, config.worker.rollout.limit_images)
        return MultiTurnRollout(workers, config, tokenizer, pad_id, images, stream)
    return SingleTurnRollout(workers, config.data.max_response_length, pad_id)


def multi_turn_metrics(batch: Batch) -> dict[str, float]:
    """``multi_turn/*`` of a multi-turn batch ({} otherwise; docs/metrics.md): turn, tool-call, error, timeout and
    tool-image counts, ``masked_token_share`` (tool and environment tokens / response tokens)."""
    if "multi_turn_stats" not in batch:
        return {}
    stats = batch["multi_turn_stats"]
    turns = np.array([s["assistant_turns"] for s in stats], dtype=float)
    total = sum(s["tokens"] for s in stats)
    assistant = sum(s["assistant_tokens"] for s in stats)
    return {
        "multi_turn/assistant_turns/mean": float(turns.mean()),
        "multi_turn/assistant_turns/max": float(turns.max()),
        "multi_turn/assistant_turns/min": float(turns.min()),
        "multi_turn/user_turns/mean": float(np.mean([s["user_turns"] for s in stats])),
        "multi_turn/tool_calls": float(sum(s["tool_calls"] for s in stats)),
        "multi_turn/tool_calls_per_traj/mean": float(np.mean([s["tool_calls"] for s in stats])),
        "multi_turn/tool_errors": float(sum(s["tool_errors"] for s in stats)),
        "multi_turn/tool_timeouts": float(sum(s["tool_timeouts"] for s in stats)),
        "multi_turn/masked_token_share": float(1.0 - assistant / total) if total else 0.0,
        "multi_turn/assistant_tokens_per_turn/mean": float(assistant / max(turns.sum(), 1.0)),
        **{f"multi_turn/{key}": float(sum(s[key] for s in stats))  # tool images (VL), kept and over the limit
           for key in ("tool_images", "tool_images_dropped") if key in stats[0]},
    }
