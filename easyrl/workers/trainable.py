"""``FSDPTrainable``: a Hugging Face model (text or Qwen-VL) sharded with FSDP2 over all workers, its micro-batches and
the update loop, under the policy (``easyrl.workers.policy``) and the critic (``easyrl.workers.critic``). Every worker
calls the same methods with equally sized batches (FSDP2 all-gathers collectively: as many forwards on every rank).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoConfig
from transformers.utils import is_flash_attn_2_available

from easyrl.batch import Batch
from easyrl.config import OffloadConfig, TrainedRoleConfig
from easyrl.models.families import attends_in_chunks, attends_in_windows, engine_temperature_tuning, text_config
from easyrl.models.hf_folder import supports_sdpa
from easyrl.models.packed_attention import carry_positions
from easyrl.models.ulysses import attention_name, sequence_parallel_group
from easyrl.workers.fsdp_model import clip_grad_norm, load_sharded_model
from easyrl.workers.optim import build_lr_scheduler, build_optimizer, move_optimizer_state, offloads_optimizer
from easyrl.workers.policy_forward import ModelInputs, attention_implementation, flash_attention_warning
from easyrl.workers.seqlen_balancing import count_micro_batches, dynamic_micro_batches
from easyrl.workers.vl_hooks import VisionHooks

__all__ = ["FSDPTrainable", "NonFiniteGradientError", "skip_nonfinite_step", "token_share"]

logger = logging.getLogger("easyrl.actor")


@functools.cache
def _warn_once(message: Optional[str]) -> None:
    """Log ``message`` once per process, on rank 0 only (None: nothing)."""
    if message and (not dist.is_initialized() or dist.get_rank() == 0):
        logger.warning(message)


def match_engine_temperature(hf_config: Any, model_path: str, engine_len: int) -> Optional[bool]:
    """Set Llama 4's ``attn_temperature_tuning`` on ``hf_config`` (its text config; in memory: an export copies the
    folder's) as vLLM sets it for an engine of ``engine_len`` tokens (``families.engine_temperature_tuning``, reading
    ``model_path``'s ``generation_config.json``), so that the actor scores with the queries the engine sampled with.
    Returns the value set, None for another family (nothing set)."""
    path = os.path.join(model_path, "generation_config.json")
    generation = json.loads(Path(path).read_text()) if os.path.isfile(path) else {}
    tuning = engine_temperature_tuning(hf_config, generation, engine_len)
    if tuning is not None:
        text = text_config(hf_config)
        text.attn_temperature_tuning = tuning
    return tuning


class FSDPTrainable:
    """A sharded model with, when trainable, an optimizer and its LR schedule (``training_steps`` long);
    micro-batching and the update loop. ``init_from``: a model of the same checkpoint whose shards to copy."""

    def __init__(self, model_path: str, config: TrainedRoleConfig, mesh: DeviceMesh, device: str,
                 torch_device: torch.device, trainable: bool, offload: OffloadConfig, training_steps: int = 0,
                 init_from: Optional[FSDPTrainable] = None, engine_len: Optional[int] = None):
        self.config = config
        self.torch_device = torch_device
        self.dp_size = mesh.size()
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=config.model.trust_remote_code)
        if engine_len is not None:  # the rollout engine's max_model_len: its Llama 4 query temperature
            match_engine_temperature(hf_config, model_path, engine_len)
        flash = is_flash_attn_2_available()
        attn = attention_implementation(device, config.padding_free, config.fsdp.param_dtype, flash,
                                        windowed=attends_in_windows(hf_config), sdpa=supports_sdpa(hf_config),
                                        chunked=attends_in_chunks(hf_config))
        self.sp = sequence_parallel_group() if config.padding_free else None  # easyrl.models.ulysses
        attn = attention_name(attn) if self.sp else attn
        _warn_once(flash_attention_warning(device, config.padding_free, config.fsdp.param_dtype, flash))
        self.model = load_sharded_model(model_path, hf_config, config, mesh, device, trainable, offload,
                                        init_from=init_from and init_from.model, attn_implementation=attn,
                                        adapt=self._adapt_model)
        if self.sp:
            self.sp.attach(self.model)
        if config.padding_free:  # a packed row's boundaries reach attentions their layers give no positions (Llama 4)
            carry_positions(self.model)
        self.vision = VisionHooks(self.model, hf_config)  # the blank image, stray pads, vLLM's positions
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.num_updates = 0
        self.consecutive_skips = 0  # optimizer steps skipped in a row for a non-finite gradient norm
        if trainable:
            self.optimizer = build_optimizer([p for p in self.model.parameters() if p.requires_grad], config.optim)
            self.lr_scheduler = build_lr_scheduler(self.optimizer, config.optim, training_steps)
        self.offload_optimizer = trainable and offloads_optimizer(device, offload.offload_params,
                                                                  offload.offload_optimizer)

    def _adapt_model(self, model: torch.nn.Module, full_state: dict[str, torch.Tensor]) -> None:
        """Change the freshly built (meta) model, and on rank 0 the checkpoint's state dict to match, before
        sharding. Kept as is here (the critic swaps its head)."""

    def _run_model(self, micro: Batch, forward: Callable[[torch.nn.Module, ModelInputs], Any]) -> Any:
        """``forward(model, inputs)`` on one micro-batch's tensors moved to the device (:class:`ModelInputs`), with
        the VL hooks armed (blank image, stray pad ids)."""
        with self.vision.model_inputs(micro, self.torch_device) as inputs:
            return forward(self.model, inputs)

    def _micro_batches(self, data: Batch, micro_batch_size: int) -> list[tuple[list[int], Batch]]:
        """``(indices, micro-batch)`` pairs covering ``data``: fixed ``micro_batch_size`` pieces, or with
        ``dynamic_batching`` pieces of at most ``max_token_len_per_device`` x ``ulysses_size`` tokens; as many on
        every rank (a MAX all-reduce, which also agrees on VL tower passes: ``VisionHooks.tower_passes``)."""
        lengths = data["attention_mask"].sum(-1).tolist()
        sp = self.sp.size if self.sp else 1  # a micro-batch is split over the sequence-parallel group's devices
        budget = (self.config.max_token_len_per_device or 0) * sp or micro_batch_size * data["attention_mask"].shape[1]
        count = count_micro_batches(lengths, budget) if self.config.dynamic_batching else 0
        if self.config.dynamic_batching or self.vision.has_vision:  # the same on every rank
            agreed = torch.tensor([count, self.vision.local_passes(data)], device=self.torch_device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            count, self.vision.tower_passes = int(agreed[0]), max(1, int(agreed[1]))
        if not self.config.dynamic_batching:
            return [(list(range(s, min(s + micro_batch_size, len(data)))), piece)
                    for s, piece in zip(range(0, len(data), micro_batch_size), data.split(micro_batch_size))]
        # at most one piece per sample (a rank scoring only some rows may have fewer than the agreed count)
        return [(part, data.select(part)) for part in dynamic_micro_batches(lengths, min(count, len(lengths)))]

    @torch.no_grad()
    def _score_responses(self, data: Batch, micro_batch_size: int, score: Callable[[Batch], torch.Tensor],
                         rows: Optional[list[int]] = None) -> torch.Tensor:
        """``score(micro)`` ``(micro_bsz, resp_len)`` of each micro-batch as one ``(bsz, resp_len)`` float32 host
        tensor, 0 at padding. ``rows``: score only these rows of ``data`` (the others stay 0; each rank its own, maybe
        none) in as many forwards as the rank with the most: their count is agreed (a MAX all-reduce) and a rank
        with fewer forwards ``data``'s first row again, its result dropped (FSDP2 all-gathers in every forward); no
        rank with a row: no forward at all."""
        self.model.eval()
        out = torch.zeros(data["response_mask"].shape, dtype=torch.float32)
        picked = data if rows is None else data.select(rows or [0])  # no rows: the filler row's micro-batch
        pieces = self._micro_batches(picked, micro_batch_size)
        if rows is not None:
            pieces = [([rows[i] for i in indices], micro) for indices, micro in pieces] if rows else []
            agreed = torch.tensor([len(pieces)], device=self.torch_device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            pieces += [([], data.select([0]))] * (int(agreed.item()) - len(pieces))
        for indices, micro in pieces:
            scores = score(micro).float().cpu()
            if indices:
                out[indices] = scores
        return out * data["response_mask"]

    def run_epochs(self, data: Batch, mini_batch_size: int, micro_batch_size: int,
                   backward_micro: Callable[[torch.Tensor, Batch, dict, dict], None],
                   role: str, before_step: Optional[Callable[[], None]] = None) -> dict[str, list[float]]:
        """``ppo_epochs`` reshuffled passes over ``data``: per mini-batch, the global token/sequence counts
        (all-reduced), ``backward_micro(indices, micro, agg_kwargs, step_metrics)`` per micro-batch, ``before_step()``
        (may raise before any weight moves), clipping to ``max_grad_norm`` and one optimizer step (skipped on a
        non-finite norm); then one LR-schedule step. Returns metric name -> values (``backward_micro``'s per step,
        ``<role>/grad_norm``, ``<role>/skipped_steps``, ``<role>/lr``)."""
        cfg = self.config
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        self.num_updates += 1
        self.optimizer_to(self.torch_device)
        generator = torch.Generator().manual_seed(self.num_updates)  # a new mini-batch shuffle every step
        num_skipped = 0
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(len(data), generator=generator)
            for start in range(0, len(data), mini_batch_size):
                mini_index = order[start:start + mini_batch_size]
                mini = data.select(mini_index)
                mask = mini["response_mask"]
                # int64: exact, and supported by every backend (HCCL's float64 all-reduce is patchy)
                counts = torch.tensor([mask.sum(), (mask.sum(-1) > 0).sum()], dtype=torch.int64,
                                      device=self.torch_device)
                dist.all_reduce(counts)
                agg_kwargs = dict(global_num_tokens=counts[0].item(), global_num_seqs=counts[1].item(),
                                  dp_size=self.dp_size)
                step_metrics: dict[str, float] = defaultdict(float)
                for index, micro in self._micro_batches(mini, micro_batch_size):
                    backward_micro(mini_index[index], micro, agg_kwargs, step_metrics)
                if before_step is not None:
                    before_step()
                grad_norm = clip_grad_norm(self.model.parameters(), cfg.max_grad_norm, self.torch_device)
                skipped = skip_nonfinite_step(grad_norm.item(), self.consecutive_skips, cfg.max_consecutive_skips,
                                              role)
                self.consecutive_skips = skipped * (self.consecutive_skips + 1)
                if not skipped:
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                num_skipped += skipped
                for key, value in step_metrics.items():
                    metrics[key].append(value)
                metrics[f"{role}/grad_norm"].append(grad_norm.item())
        metrics[f"{role}/skipped_steps"].append(float(num_skipped))  # a count; the same on every rank
        metrics[f"{role}/lr"].append(self.lr_scheduler.get_last_lr()[0])  # the LR this step's updates used
        self.lr_scheduler.step()
        self.optimizer_to("cpu")
        return dict(metrics)

    def optimizer_to(self, device: torch.device | str) -> None:
        """With an offloaded optimizer, move its states to ``device`` (compute device or ``cpu``); else nothing."""
        if self.offload_optimizer:
            move_optimizer_state(self.optimizer, device)


class NonFiniteGradientError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite gradient norm (``worker.<role>.max_consecutive_skips``)."""


def skip_nonfinite_step(grad_norm: float, consecutive: int, limit: int, role: str = "actor") -> bool:
    """Whether to skip the optimizer step: the global gradient norm (before clipping) is NaN or infinite.
    ``consecutive``: steps skipped in a row before this one. Raises ``NonFiniteGradientError`` when this would be the
    ``limit``-th skip in a row (``worker.<role>.max_consecutive_skips``; ``<= 0``: never)."""
    if math.isfinite(grad_norm):
        return False
    if 0 < limit <= consecutive + 1:
        raise NonFiniteGradientError(
            f"the gradient norm was {grad_norm} in {consecutive + 1} optimizer steps in a row "
            f"(worker.{role}.max_consecutive_skips={limit}): the run is diverging. Lower worker.{role}.optim.lr, check "
            f"the data and rewards, or resume from an earlier checkpoint."
        )
    logger.warning("%s grad_norm is %s: optimizer step skipped (%d in a row)", role, grad_norm, consecutive + 1)
    return True


def token_share(mask: torch.Tensor, agg_kwargs: dict) -> float:
    """This micro-batch's fraction of the mini-batch's tokens, times ``dp_size`` (so that summing over micro-batches
    and averaging over workers weights a per-token mean correctly)."""
    return mask.sum().item() / agg_kwargs["global_num_tokens"] * agg_kwargs["dp_size"]
