"""The FSDP2 policy: a Hugging Face causal LM (text or Qwen-VL) sharded with ``fully_shard`` over all workers.

Used twice per worker: as the trainable actor (log-probs + PPO-style updates) and as the frozen reference policy.
Every worker calls the same methods with equally sized batches (FSDP2 all-gathers parameters collectively, so the
workers must run the same number of forwards).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoConfig
from transformers.utils import is_flash_attn_2_available

from easyrl.algorithms.kl import kl_penalty
from easyrl.algorithms.loss_agg import agg_loss
from easyrl.algorithms.policy_losses import POLICY_LOSSES, PolicyLossInputs, PolicyLossSettings
from easyrl.algorithms.rollout_correction import correct_rollout
from easyrl.batch import Batch
from easyrl.config import ActorConfig, OffloadConfig
from easyrl.errors import ConfigError
from easyrl.models.fused_head import FusedLogProbHead
from easyrl.workers.fsdp_model import clip_grad_norm, load_sharded_model
from easyrl.workers.optim import build_lr_scheduler, build_optimizer, move_optimizer_state, offloads_optimizer
from easyrl.workers.policy_forward import (
    ModelInputs,
    PolicyScores,
    attention_implementation,
    flash_attention_warning,
    response_scores,
)
from easyrl.workers.seqlen_balancing import count_micro_batches, dynamic_micro_batches
from easyrl.workers.vl_hooks import VisionHooks

__all__ = ["FSDPPolicy"]

logger = logging.getLogger("easyrl.actor")
_warned: set[str] = set()


def _warn_once(message: Optional[str]) -> None:
    """Log ``message`` once per process, on rank 0 only (None: nothing)."""
    if message and message not in _warned and (not dist.is_initialized() or dist.get_rank() == 0):
        _warned.add(message)
        logger.warning(message)


class FSDPPolicy:
    """A sharded policy that computes response log-probs and (when trainable) runs policy-gradient updates.

    Args:
        model_path: Hugging Face model folder or hub id.
        config: ``worker.actor`` settings (the reference policy reuses them, with its own offload settings).
        mesh: 1-D device mesh over all workers (data parallel).
        device: ``cuda``, ``npu`` or ``cpu``.
        trainable: build an AdamW optimizer and a warm-up LR schedule.
        offload: parameter offload settings (the actor's or the reference's).
        init_from: a policy of the same checkpoint whose shards to copy (the reference from the actor: no second
            checkpoint read); None reads ``model_path`` on rank 0 and broadcasts it.
    """

    scores_tokens = True  # the output embedding is the LM head (log-probs); the critic's is a value head

    def __init__(
        self,
        model_path: str,
        config: ActorConfig,
        mesh: DeviceMesh,
        device: str,
        torch_device: torch.device,
        trainable: bool,
        offload: OffloadConfig,
        init_from: Optional["FSDPPolicy"] = None,
    ):
        self.config = config
        self.device = device
        self.torch_device = torch_device
        self.dp_size = mesh.size()
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=config.model.trust_remote_code)
        if getattr(config, "router_aux_loss_coef", 0) > 0 and not has_router(hf_config):
            raise ConfigError(
                f"worker.actor.router_aux_loss_coef={config.router_aux_loss_coef} but {model_path} "
                f"({hf_config.model_type}) is not a mixture-of-experts model (no router): set it to 0"
            )
        attn = attention_implementation(device, config.padding_free, config.fsdp.param_dtype,
                                        is_flash_attn_2_available())
        _warn_once(flash_attention_warning(device, config.padding_free, config.fsdp.param_dtype,
                                           is_flash_attn_2_available()))
        model = load_sharded_model(model_path, hf_config, config, mesh, device, trainable, offload,
                                   init_from=init_from.model if init_from is not None else None,
                                   attn_implementation=attn, adapt=self._adapt_model)
        self.model = model
        self.vision = VisionHooks(model, hf_config)  # the blank image, stray pads, vLLM's positions
        self.has_vision = self.vision.has_vision
        self.fused_head = FusedLogProbHead(model) if config.padding_free and self.scores_tokens else None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.num_updates = 0
        self.consecutive_skips = 0  # optimizer steps skipped in a row for a non-finite gradient norm
        if trainable:
            optim = config.optim
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = build_optimizer(params, optim)
            self.lr_scheduler = build_lr_scheduler(self.optimizer, optim)
        self.offload_optimizer = trainable and offloads_optimizer(
            device, offload.offload_params, getattr(offload, "offload_optimizer", False))

    def _adapt_model(self, model: torch.nn.Module, full_state: dict[str, torch.Tensor]) -> None:
        """Change the freshly built (meta) model, and on rank 0 the checkpoint's state dict to match, before
        sharding. The policy keeps the checkpoint's model as is (the critic swaps its head)."""

    def _forward(self, micro: Batch, temperature: float, with_entropy: bool,
                 entropy_grad: bool = False, router_aux: bool = False) -> PolicyScores:
        """Log-probs (and entropies, and the MoE router's aux loss) of the response tokens of one micro-batch, each
        ``(micro_bsz, resp_len)``, padding-free or padded (``worker.actor.padding_free``, see
        ``easyrl.workers.policy_forward``)."""
        return self._run_model(micro, lambda model, inputs: response_scores(
            model, inputs, temperature, with_entropy=with_entropy, entropy_grad=entropy_grad,
            fused_head=self.fused_head, is_vl=self.has_vision, router_aux=router_aux))

    def _run_model(self, micro: Batch, forward: Callable[[torch.nn.Module, ModelInputs], Any]) -> Any:
        """``forward(model, inputs)`` on one micro-batch's tensors moved to the device (:class:`ModelInputs`), with
        the VL hooks armed (blank image, stray pad ids)."""
        with self.vision.model_inputs(micro, self.torch_device) as inputs:
            return forward(self.model, inputs)

    def _micro_batches(self, data: Batch, micro_batch_size: int) -> list[tuple[list[int], Batch]]:
        """``(indices, micro-batch)`` pairs covering ``data``: fixed ``micro_batch_size`` pieces, or with
        ``worker.actor.dynamic_batching`` pieces of at most ``max_token_len_per_device`` tokens (default
        ``micro_batch_size`` x the padded sequence length), as many on every rank (a MAX all-reduce)."""
        if not self.config.dynamic_batching:
            return [(list(range(s, min(s + micro_batch_size, len(data)))), piece)
                    for s, piece in zip(range(0, len(data), micro_batch_size), data.split(micro_batch_size))]
        lengths = data["attention_mask"].sum(-1).tolist()
        budget = self.config.max_token_len_per_device or micro_batch_size * data["attention_mask"].shape[1]
        count = torch.tensor(count_micro_batches(lengths, budget), device=self.torch_device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        parts = dynamic_micro_batches(lengths, int(count.item()))
        return [(part, data.select(part)) for part in parts]

    @torch.no_grad()
    def compute_log_probs(self, data: Batch, micro_batch_size: int, temperature: float) -> torch.Tensor:
        """Response log-probs under the current weights, ``(bsz, resp_len)`` on the host, 0 at padding."""
        self.model.eval()
        out = torch.zeros(data["response_mask"].shape, dtype=torch.float32)
        for indices, micro in self._micro_batches(data, micro_batch_size):
            out[indices] = self._forward(micro, temperature, with_entropy=False).log_probs.float().cpu()
        return out * data["response_mask"]

    def update_policy(self, data: Batch, mini_batch_size: int, micro_batch_size: int) -> dict[str, list[float]]:
        """``ppo_epochs`` passes of clipped policy-gradient updates over this worker's share of the rollout batch.

        Args:
            data: this worker's samples with ``old_log_probs``, ``advantages``, ``response_mask`` (and
                ``ref_log_probs`` when the KL loss is on, ``rollout_log_probs`` when ``tis_cap`` is set). Without
                ``old_log_probs`` the step must be on-policy (one epoch, one mini-batch): every forward then runs
                before the only optimizer step, so the detached current log-probs are the old ones (as in verl);
                they are kept in ``self.on_policy_log_probs`` ``(bsz, resp_len)``.
            mini_batch_size: samples of this worker per optimizer step (``global_batch_size * n / world_size``).
            micro_batch_size: samples per forward/backward (or the token budget's unit with dynamic batching).

        Returns:
            metric name -> values (one per micro-batch or per optimizer step); the trainer averages them.

        Raises:
            ValueError: ``old_log_probs`` is missing but the update takes several optimizer steps.
        """
        cfg = self.config
        policy_loss_fn = POLICY_LOSSES.get(cfg.loss_type)
        on_policy = "old_log_probs" not in data
        if on_policy and (cfg.ppo_epochs != 1 or mini_batch_size < len(data)):
            raise ValueError("old_log_probs are needed: this update takes several optimizer steps (ppo_epochs="
                             f"{cfg.ppo_epochs}, {len(data)} samples in mini-batches of {mini_batch_size})")
        self.on_policy_log_probs = torch.zeros(data["response_mask"].shape) if on_policy else None

        def backward_micro(indices: torch.Tensor, micro: Batch, agg_kwargs: dict, step_metrics: dict) -> None:
            log_probs = self._backward_micro(micro, policy_loss_fn, agg_kwargs, step_metrics)
            if on_policy:
                self.on_policy_log_probs[indices] = log_probs.float().cpu()

        return self.run_epochs(data, mini_batch_size, micro_batch_size, backward_micro, role="actor")

    def run_epochs(self, data: Batch, mini_batch_size: int, micro_batch_size: int,
                   backward_micro: Callable[[torch.Tensor, Batch, dict, dict], None],
                   role: str) -> dict[str, list[float]]:
        """``ppo_epochs`` reshuffled passes over ``data`` (the actor's and the critic's update loop): per mini-batch,
        the global token/sequence counts (all-reduced), ``backward_micro(indices, micro, agg_kwargs, step_metrics)``
        per micro-batch (``indices``: the micro-batch's rows in ``data``), gradient clipping to ``max_grad_norm`` and
        one optimizer step (skipped on a non-finite norm); then one LR-schedule step.

        Returns:
            metric name -> values: what ``backward_micro`` added per optimizer step, ``<role>/grad_norm`` per step,
            ``<role>/skipped_steps`` and ``<role>/lr`` (the learning rate these steps used).
        """
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
        """With ``offload.offload_optimizer`` (see ``easyrl.workers.optim.offloads_optimizer``): move the optimizer
        states to ``device`` (the compute device for an update or a checkpoint, ``cpu`` after it); else nothing."""
        if self.offload_optimizer:
            move_optimizer_state(self.optimizer, device)

    def _backward_micro(self, micro: Batch, policy_loss_fn, agg_kwargs: dict,
                        step_metrics: dict[str, float]) -> torch.Tensor:
        """Loss of one micro-batch (scaled for global normalisation) and its backward pass; adds to ``step_metrics``
        the micro-batch's share of each loss (they sum to the mini-batch value) and the share-weighted ratios.
        Returns the micro-batch's detached log-probs ``(micro_bsz, resp_len)``."""
        cfg = self.config
        dev = self.torch_device
        mask = micro["response_mask"].to(dev)
        advantages = micro["advantages"].to(dev)
        log_probs, entropy, router_aux_loss = self._forward(
            micro, cfg.temperature, with_entropy=True, entropy_grad=cfg.entropy_coeff != 0,
            router_aux=cfg.router_aux_loss_coef > 0)
        # on-policy (no old-log-prob pass): the weights have not moved yet, so old = current, detached
        old_log_probs = micro["old_log_probs"].to(dev) if "old_log_probs" in micro else log_probs.detach()
        tis_weights, loss_mask = None, mask
        if POLICY_LOSSES.trait(cfg.loss_type, "uses_engine_log_probs"):  # bypass mode: the loss corrects itself
            old_log_probs = micro["rollout_log_probs"].to(dev)
        elif cfg.tis_cap is not None or cfg.rollout_is is not None or cfg.rollout_rs is not None:
            tis_weights, loss_mask, corr_metrics = correct_rollout(
                old_log_probs, micro["rollout_log_probs"].to(dev), mask, tis_cap=cfg.tis_cap,
                rollout_is=cfg.rollout_is, rollout_is_threshold=cfg.rollout_is_threshold,
                rollout_is_threshold_lower=cfg.rollout_is_threshold_lower, rollout_rs=cfg.rollout_rs,
                rollout_rs_threshold=cfg.rollout_rs_threshold)
            for key, value in corr_metrics.items():  # token means: weight by token share
                step_metrics[key] += value * _share(mask, agg_kwargs)
        pg_loss, pg_metrics = policy_loss_fn(
            PolicyLossInputs(old_log_probs, log_probs, advantages, loss_mask, rollout_is_weights=tis_weights,
                             agg_kwargs=agg_kwargs), PolicyLossSettings.of(cfg))
        entropy_loss = agg_loss(entropy, mask, cfg.loss_agg_mode, **agg_kwargs)
        loss = pg_loss - cfg.entropy_coeff * entropy_loss
        if cfg.use_kl_loss and not cfg.disable_kl:
            kl = kl_penalty(log_probs, micro["ref_log_probs"].to(dev), cfg.kl_penalty)
            kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, **agg_kwargs)
            loss = loss + cfg.kl_coef * kl_loss
            step_metrics["actor/kl_loss"] += kl_loss.item()
            step_metrics["actor/kl_coef"] = cfg.kl_coef
        if router_aux_loss is not None:
            # a micro-batch mean over its tokens, weighted by the micro-batch's share of the mini-batch's response
            # tokens (x dp_size, as agg_loss): a token-weighted mean over the mini-batch, whatever the split
            weighted = router_aux_loss * _share(mask, agg_kwargs)
            loss = loss + cfg.router_aux_loss_coef * weighted
            step_metrics["actor/router_aux_loss"] += weighted.item()
        loss.backward()
        step_metrics["actor/pg_loss"] += pg_loss.item()
        step_metrics["actor/entropy"] += entropy_loss.item()
        share = _share(mask, agg_kwargs)
        for key, value in pg_metrics.items():  # bypass_mode's rollout_corr/* keep their prefix
            step_metrics[key if "/" in key else f"actor/{key}"] += float(value) * share
        return log_probs.detach()


def has_router(hf_config) -> bool:
    """Whether a transformers model config describes a mixture of experts that can return its router's
    load-balancing loss (``output_router_logits`` in the config or its ``text_config``)."""
    text = getattr(hf_config, "text_config", None) or hf_config
    return hasattr(text, "output_router_logits") or hasattr(hf_config, "output_router_logits")


class NonFiniteGradientError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite gradient norm (``worker.actor.max_consecutive_skips``)."""


def skip_nonfinite_step(grad_norm: float, consecutive: int, limit: int, role: str = "actor") -> bool:
    """Whether to skip the optimizer step for this gradient norm (it is NaN or infinite).

    Args:
        grad_norm: the global gradient norm (before clipping) of the mini-batch.
        consecutive: optimizer steps skipped in a row before this one.
        limit: ``worker.<role>.max_consecutive_skips``; the run stops when this many steps in a row are skipped
            (``<= 0``: never).
        role: ``actor`` or ``critic`` (named in the error).

    Raises:
        NonFiniteGradientError: this would be the ``limit``-th skip in a row.
    """
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


def _share(mask: torch.Tensor, agg_kwargs: dict) -> float:
    """This micro-batch's fraction of the mini-batch's tokens, times ``dp_size`` (so that summing over micro-batches
    and averaging over workers weights a per-token mean correctly)."""
    return mask.sum().item() / agg_kwargs["global_num_tokens"] * agg_kwargs["dp_size"]
