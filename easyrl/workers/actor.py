"""The FSDP2 policy: a Hugging Face causal LM (text or Qwen-VL) sharded with ``fully_shard`` over all workers.

Used twice per worker: as the trainable actor (log-probs + PPO-style updates) and as the frozen reference policy.
Every worker calls the same methods with equally sized batches (FSDP2 all-gathers parameters collectively, so the
workers must run the same number of forwards).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoConfig

from easyrl.algorithms.kl import kl_penalty
from easyrl.algorithms.losses import agg_loss, compute_tis_weights, get_policy_loss
from easyrl.algorithms.token_ops import entropy_from_logits, log_probs_from_logits
from easyrl.batch import Batch
from easyrl.config import ActorConfig, OffloadConfig
from easyrl.workers.fsdp_model import clip_grad_norm, hf_model_class, load_sharded_model

__all__ = ["FSDPPolicy", "hf_model_class"]

logger = logging.getLogger("easyrl.actor")


def _merge_multimodal(mm_inputs: list[dict[str, torch.Tensor]], device: torch.device) -> dict[str, torch.Tensor]:
    """Concatenate per-sample processor outputs (``pixel_values`` (patches, dim), ``image_grid_thw`` (images, 3))
    in sample order, which is the order of the image pad tokens in the batch."""
    merged: dict[str, list[torch.Tensor]] = defaultdict(list)
    for sample in mm_inputs:
        for key, value in sample.items():
            merged[key].append(value)
    return {key: torch.cat(values, dim=0).to(device) for key, values in merged.items()}


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
        model = load_sharded_model(model_path, hf_config, config, mesh, device, trainable, offload,
                                   init_from=init_from.model if init_from is not None else None)
        self.model = model
        self.has_vision = getattr(hf_config, "vision_config", None) is not None
        self.add_blank_image = False
        if self.has_vision:
            model.get_input_embeddings().register_forward_hook(self._blank_image_hook)
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.num_updates = 0
        if trainable:
            optim = config.optim
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(
                params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
            )
            warmup = int(optim.lr_warmup_ratio * max(optim.training_steps, 0))
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
            )

    def _forward(self, micro: Batch, temperature: float, with_entropy: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Log-probs (and entropies) of the response tokens of one micro-batch, each ``(micro_bsz, resp_len)``."""
        responses = micro["responses"].to(self.torch_device)
        resp_len = responses.shape[1]
        input_ids = micro["input_ids"].to(self.torch_device)
        attention_mask = micro["attention_mask"].to(self.torch_device)
        inputs = _merge_multimodal(micro.extras.get("multi_modal_inputs", []), self.torch_device)
        inputs["input_ids"] = input_ids
        if "pixel_values" in inputs:
            # Qwen-VL computes its 3-D (mRoPE) positions itself, from the image tokens and the padding mask
            inputs["mm_token_type_ids"] = self._mm_token_type_ids(input_ids)
        else:
            # prompts are left-padded: positions count only real tokens, as in vLLM (which sees no padding)
            inputs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        self.add_blank_image = self.has_vision and "pixel_values" not in inputs
        try:
            output = self.model(attention_mask=attention_mask, use_cache=False, logits_to_keep=resp_len + 1, **inputs)
        finally:
            self.add_blank_image = False
        # position t predicts token t+1: the last resp_len + 1 positions minus the final one predict the response
        # no float32 copy of the (micro_bsz, resp_len, vocab) logits: the token ops upcast chunk by chunk
        logits = output.logits[:, :-1, :]
        log_probs = log_probs_from_logits(logits, responses, temperature=temperature)
        entropy = entropy_from_logits(logits, temperature=temperature) if with_entropy else None
        return log_probs, entropy

    def _blank_image_hook(self, module: torch.nn.Module, args: Any, embeds: torch.Tensor) -> torch.Tensor:
        """Forward hook of the token embedding of a VL model: for a micro-batch without images, add 0 * the vision
        tower's output on one blank image of 2x2 patches to the embeddings ``(bsz, seq_len, hidden)``.

        FSDP2 gathers (forward) and reduce-scatters (backward) each block's shards collectively, in the order the
        blocks ran in the forward (it also prefetches by that order), so every rank must run the vision tower at the
        same point of every micro-batch if any rank does: a micro-batch without images on one rank while another
        rank's has some would otherwise hang. The model embeds tokens right before it encodes images, so running the
        tower here, inside the root's forward, reproduces the order of an image batch (verl handles mixed text/image
        data with a blank image too).
        """
        if not self.add_blank_image:
            return embeds
        vision = self.model.config.vision_config
        merge = vision.spatial_merge_size
        patch_dim = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        pixels = torch.zeros(merge * merge, patch_dim, device=embeds.device)
        grid = torch.tensor([[1, merge, merge]], device=embeds.device)
        features = [t for t in _tensors_in(self.model.model.visual(pixels, grid_thw=grid)) if t.is_floating_point()]
        return embeds + sum(t.sum() for t in features).to(embeds.dtype) * 0.0

    def _mm_token_type_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``(bsz, seq_len)``: 1 at image pad tokens, 2 at video pad tokens, 0 elsewhere (what the Qwen-VL
        processor returns for a prompt; rebuilt here for the padded prompt + response)."""
        config = self.model.config
        types = torch.zeros_like(input_ids)
        types[input_ids == config.image_token_id] = 1
        if getattr(config, "video_token_id", None) is not None:
            types[input_ids == config.video_token_id] = 2
        return types

    @torch.no_grad()
    def compute_log_probs(self, data: Batch, micro_batch_size: int, temperature: float) -> torch.Tensor:
        """Response log-probs under the current weights, ``(bsz, resp_len)`` on the host, 0 at padding."""
        self.model.eval()
        pieces = [self._forward(micro, temperature, with_entropy=False)[0].cpu() for micro in data.split(micro_batch_size)]
        return torch.cat(pieces, dim=0) * data["response_mask"]

    def update_policy(self, data: Batch, mini_batch_size: int, micro_batch_size: int) -> dict[str, list[float]]:
        """``ppo_epochs`` passes of clipped policy-gradient updates over this worker's share of the rollout batch.

        Args:
            data: this worker's samples with ``old_log_probs``, ``advantages``, ``response_mask`` (and
                ``ref_log_probs`` when the KL loss is on, ``rollout_log_probs`` when ``tis_cap`` is set).
            mini_batch_size: samples of this worker per optimizer step (``global_batch_size * n / world_size``).
            micro_batch_size: samples per forward/backward.

        Returns:
            metric name -> values (one per micro-batch or per optimizer step); the trainer averages them.
        """
        cfg = self.config
        self.model.train()
        policy_loss_fn = get_policy_loss(cfg.loss_type)
        metrics: dict[str, list[float]] = defaultdict(list)
        self.num_updates += 1
        generator = torch.Generator().manual_seed(self.num_updates)  # a new mini-batch shuffle every step
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(len(data), generator=generator)
            for mini in data.select(order).split(mini_batch_size):
                mask = mini["response_mask"]
                # int64: exact, and supported by every backend (HCCL's float64 all-reduce is patchy)
                counts = torch.tensor([mask.sum(), (mask.sum(-1) > 0).sum()], dtype=torch.int64, device=self.torch_device)
                dist.all_reduce(counts)
                agg_kwargs = dict(global_num_tokens=counts[0].item(), global_num_seqs=counts[1].item(), dp_size=self.dp_size)
                step_metrics: dict[str, float] = defaultdict(float)
                for micro in mini.split(micro_batch_size):
                    self._backward_micro(micro, policy_loss_fn, agg_kwargs, step_metrics)
                grad_norm = clip_grad_norm(self.model.parameters(), cfg.max_grad_norm, self.torch_device)
                if torch.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    logger.warning("grad_norm is %s: optimizer step skipped", grad_norm.item())
                self.optimizer.zero_grad(set_to_none=True)
                for key, value in step_metrics.items():
                    metrics[key].append(value)
                metrics["actor/grad_norm"].append(grad_norm.item())
        self.lr_scheduler.step()
        metrics["actor/lr"].append(self.lr_scheduler.get_last_lr()[0])
        return dict(metrics)

    def _backward_micro(self, micro: Batch, policy_loss_fn, agg_kwargs: dict, step_metrics: dict[str, float]) -> None:
        """Loss of one micro-batch (scaled for global normalisation) and its backward pass; adds to ``step_metrics``
        the micro-batch's share of each loss (they sum to the mini-batch value) and the share-weighted ratios."""
        cfg = self.config
        dev = self.torch_device
        mask = micro["response_mask"].to(dev)
        old_log_probs = micro["old_log_probs"].to(dev)
        advantages = micro["advantages"].to(dev)
        log_probs, entropy = self._forward(micro, cfg.temperature, with_entropy=True)
        tis_weights = None
        if cfg.tis_cap is not None:
            tis_weights, tis_metrics = compute_tis_weights(
                old_log_probs, micro["rollout_log_probs"].to(dev), mask, cfg.tis_cap
            )
            for key in ("rollout/tis_weight_mean", "rollout/tis_clip_frac"):  # token means: weight by token share
                step_metrics[key] += tis_metrics[key] * _share(mask, agg_kwargs)
        pg_loss, pg_metrics = policy_loss_fn(
            old_log_probs, log_probs, advantages, mask,
            loss_agg_mode=cfg.loss_agg_mode, clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
            clip_ratio_dual=cfg.clip_ratio_dual, agg_kwargs=agg_kwargs, rollout_is_weights=tis_weights,
        )
        entropy_loss = agg_loss(entropy, mask, cfg.loss_agg_mode, **agg_kwargs)
        loss = pg_loss - cfg.entropy_coeff * entropy_loss
        if cfg.use_kl_loss and not cfg.disable_kl:
            kl = kl_penalty(log_probs, micro["ref_log_probs"].to(dev), cfg.kl_penalty)
            kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, **agg_kwargs)
            loss = loss + cfg.kl_coef * kl_loss
            step_metrics["actor/kl_loss"] += kl_loss.item()
            step_metrics["actor/kl_coef"] = cfg.kl_coef
        loss.backward()
        step_metrics["actor/pg_loss"] += pg_loss.item()
        step_metrics["actor/entropy"] += entropy_loss.item()
        share = _share(mask, agg_kwargs)
        for key, value in pg_metrics.items():
            step_metrics[f"actor/{key}"] += float(value) * share


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) model output, tuple, list or dict."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors_in(v)]
    return []


def _share(mask: torch.Tensor, agg_kwargs: dict) -> float:
    """This micro-batch's fraction of the mini-batch's tokens, times ``dp_size`` (so that summing over micro-batches
    and averaging over workers weights a per-token mean correctly)."""
    return mask.sum().item() / agg_kwargs["global_num_tokens"] * agg_kwargs["dp_size"]
