"""The FSDP2 policy (``FSDPPolicy``, an ``FSDPTrainable`` whose output embedding is the LM head): response log-probs
and policy-gradient updates. The trainable actor, and frozen, the reference policy and the distillation teacher.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from transformers import AutoConfig

from easyrl.algorithms.kl import kl_penalty
from easyrl.algorithms.loss_agg import agg_loss
from easyrl.algorithms.policy_losses import POLICY_LOSSES, LossOut, PolicyLossInputs, PolicyLossSettings
from easyrl.algorithms.rollout_correction import correct_rollout, log_prob_diff_median
from easyrl.batch import Batch
from easyrl.config import ActorConfig
from easyrl.errors import ConfigError
from easyrl.models.families import family
from easyrl.models.fused_head import FusedLogProbHead
from easyrl.models.router_replay import RouterReplay
from easyrl.workers.policy_forward import PolicyScores, response_scores
from easyrl.workers.trainable import FSDPTrainable, token_share
from easyrl.workers.weight_sync import check_weight_sync

__all__ = ["FSDPPolicy", "has_router"]


class FSDPPolicy(FSDPTrainable):
    """A sharded policy: response log-probs and (when trainable) policy-gradient updates. Raises ``ConfigError``
    for ``worker.actor.router_aux_loss_coef`` > 0 on a model without a router (before it is loaded)."""

    def __init__(self, model_path: str, config: ActorConfig, *args: Any, **kwargs: Any):
        if config.router_aux_loss_coef > 0:
            hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=config.model.trust_remote_code)
            if not has_router(hf_config):
                raise ConfigError(
                    f"worker.actor.router_aux_loss_coef={config.router_aux_loss_coef} but {model_path} "
                    f"({hf_config.model_type}) is not a mixture-of-experts model (no router): set it to 0"
                )
        super().__init__(model_path, config, *args, **kwargs)
        self.fused_head = FusedLogProbHead(self.model) if config.padding_free else None
        # the trained policy replays a routing (R2, R3); the reference and teachers route by themselves
        replays = self.optimizer is not None and config.router_replay.enabled
        self.router_replay = RouterReplay(self.model, family(self.model.config).router) if replays else None

    def _forward(self, micro: Batch, temperature: float, with_entropy: bool,
                 entropy_grad: bool = False, router_aux: bool = False, record: bool = False) -> PolicyScores:
        """Log-probs (and entropies, and the MoE router's aux loss) of the response tokens of one micro-batch, each
        ``(micro_bsz, resp_len)``, padding-free or padded (``worker.actor.padding_free``, see
        ``easyrl.workers.policy_forward``); ``record``: and the routing it used."""
        return self._run_model(micro, lambda model, inputs: response_scores(
            model, inputs, temperature, with_entropy=with_entropy, entropy_grad=entropy_grad,
            fused_head=self.fused_head, router_aux=router_aux, sp=self.sp, replay=self.router_replay,
            record=record))

    def compute_log_probs_and_routing(self, data: Batch, micro_batch_size: int,
                                      temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """R2's old-log-prob pass: :meth:`compute_log_probs` and the experts the actor's routers chose for every
        token, ``(bsz, P + R, layers, top_k)`` int16 on the host (``-1`` at padding), for the update to replay.
        Raises ``ValueError`` when the policy replays no routing (``worker.actor.router_replay.mode=disabled``)."""
        if self.router_replay is None:
            raise ValueError("compute_log_probs_and_routing needs worker.actor.router_replay.mode=R2")
        routing: list[Optional[torch.Tensor]] = [None] * len(data)
        data = Batch(data.tensors.clone(recurse=False), data.extras)
        data["row_index"] = torch.arange(len(data))

        def score(micro: Batch) -> torch.Tensor:
            scores = self._forward(micro, temperature, with_entropy=False, record=True)
            for row, used in zip(micro["row_index"].tolist(), scores.routing.cpu()):
                routing[row] = used
            return scores.log_probs

        return self._score_responses(data, micro_batch_size, score), torch.stack(routing)

    def compute_log_probs(self, data: Batch, micro_batch_size: int, temperature: float,
                          rows: Optional[list[int]] = None) -> torch.Tensor:
        """Response log-probs under the current weights, ``(bsz, resp_len)`` on the host, 0 at padding; ``rows``: of
        these rows only, the others 0 (a collective call on every rank, each with its own rows, maybe none:
        ``FSDPTrainable._score_responses``)."""
        return self._score_responses(data, micro_batch_size,
                                     lambda micro: self._forward(micro, temperature, with_entropy=False).log_probs,
                                     rows)

    def update_policy(self, data: Batch, mini_batch_size: int, micro_batch_size: int,
                      sync_threshold: Optional[float] = None) -> dict[str, list[float]]:
        """``ppo_epochs`` passes of clipped policy-gradient updates over this worker's share of the rollout batch
        (``old_log_probs``, ``advantages``, ``response_mask``; ``ref_log_probs`` with the KL loss,
        ``rollout_log_probs`` with ``tis_cap``). Without ``old_log_probs`` the step must be on-policy (one epoch, one
        mini-batch, else ``ValueError``): the detached current log-probs are the old ones, kept in
        ``self.on_policy_log_probs`` ``(bsz, resp_len)``, and with ``rollout_log_probs`` the weight-sync check
        (``sync_threshold``) runs before the optimizer step, raising ``WeightSyncError`` before any weight changes.
        Returns metric name -> values (per micro-batch or per optimizer step)."""
        cfg = self.config
        loss_fn, settings = POLICY_LOSSES.get(cfg.loss_type), PolicyLossSettings.of(cfg)
        on_policy = "old_log_probs" not in data
        if on_policy and (cfg.ppo_epochs != 1 or mini_batch_size < len(data)):
            raise ValueError("old_log_probs are needed: this update takes several optimizer steps (ppo_epochs="
                             f"{cfg.ppo_epochs}, {len(data)} samples in mini-batches of {mini_batch_size})")
        self.on_policy_log_probs = torch.zeros(data["response_mask"].shape) if on_policy else None

        def backward_micro(indices: torch.Tensor, micro: Batch, agg_kwargs: dict, step_metrics: dict) -> None:
            log_probs = self._backward_micro(micro, lambda inputs: loss_fn(inputs, settings), agg_kwargs, step_metrics)
            if on_policy:
                self.on_policy_log_probs[indices] = log_probs.float().cpu()

        def check_sync() -> None:
            gap = log_prob_diff_median(self.on_policy_log_probs, data["rollout_log_probs"], data["response_mask"])
            gap = torch.tensor([gap], device=self.torch_device)
            dist.all_reduce(gap, op=dist.ReduceOp.MAX)  # every rank stops, or none
            check_weight_sync(gap.item(), sync_threshold)

        checks = on_policy and sync_threshold is not None and "rollout_log_probs" in data
        # the replayed experts the actor's routers would have chosen too, before its weights move: over this step's
        # old-log-prob pass, or without one (on-policy: one optimizer step) over the update's forwards
        replay = self.router_replay
        before = (replay.agreement(), replay.expert_load()) if replay is not None else (None, None)
        metrics = self.run_epochs(data, mini_batch_size, micro_batch_size, backward_micro, role="actor",
                                  before_step=check_sync if checks else None)
        during = (replay.agreement(), replay.expert_load()) if replay is not None else (None, None)
        for name, old, new in zip(("moe/router_agreement", "moe/expert_load_max"), before, during):
            value = old if old is not None else new
            if value is not None:
                metrics[name] = [value]
        return metrics

    def _backward_micro(self, micro: Batch, policy_loss: Callable[[PolicyLossInputs], LossOut], agg_kwargs: dict,
                        step_metrics: dict[str, float]) -> torch.Tensor:
        """Loss of one micro-batch (scaled for global normalisation) and its backward pass; adds to ``step_metrics``
        the micro-batch's share of each loss (they sum to the mini-batch value) and the share-weighted ratios.
        Returns the micro-batch's detached log-probs ``(micro_bsz, resp_len)``."""
        cfg, dev = self.config, self.torch_device
        mask = micro["response_mask"].to(dev)
        share = token_share(mask, agg_kwargs)  # token means of the micro-batch are weighted by it
        advantages = micro["advantages"].to(dev)
        scores = self._forward(micro, cfg.temperature, with_entropy=True, entropy_grad=cfg.entropy_coeff != 0,
                               router_aux=cfg.router_aux_loss_coef > 0)
        log_probs, entropy, router_aux_loss = scores.log_probs, scores.entropy, scores.router_aux_loss
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
            for key, value in corr_metrics.items():
                step_metrics[key] += value * share
        pg_loss, pg_metrics = policy_loss(
            PolicyLossInputs(old_log_probs, log_probs, advantages, loss_mask, rollout_is_weights=tis_weights,
                             agg_kwargs=agg_kwargs))
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
            weighted = router_aux_loss * share
            loss = loss + cfg.router_aux_loss_coef * weighted
            step_metrics["actor/router_aux_loss"] += weighted.item()
        loss.backward()
        step_metrics["actor/pg_loss"] += pg_loss.item()
        step_metrics["actor/entropy"] += entropy_loss.item()
        for key, value in pg_metrics.items():  # bypass_mode's rollout_corr/* keep their prefix
            step_metrics[key if "/" in key else f"actor/{key}"] += float(value) * share
        return log_probs.detach()


def has_router(hf_config) -> bool:
    """Whether a transformers model config describes a mixture of experts that can return its router's
    load-balancing loss (``output_router_logits`` in the config or its ``text_config``)."""
    text = getattr(hf_config, "text_config", None) or hf_config
    return hasattr(text, "output_router_logits") or hasattr(hf_config, "output_router_logits")
