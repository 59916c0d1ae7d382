"""The FSDP2 critic (value model) of PPO with GAE: an ``FSDPTrainable`` built and fed like the actor whose LM head
is a scalar value head. Saved with the actor in every checkpoint (folder ``critic/``).
"""

from __future__ import annotations

import torch

from easyrl.algorithms.critic import compute_value_loss
from easyrl.batch import Batch
from easyrl.config import CriticConfig
from easyrl.workers.policy_forward import response_values
from easyrl.workers.trainable import FSDPTrainable, token_share

__all__ = ["FSDPCritic", "attach_value_head"]


def attach_value_head(model: torch.nn.Module) -> str:
    """Replace the causal LM's output embedding (``lm_head``, hidden -> vocab) in place by a zero value head
    (hidden -> 1, with bias: every initial value is 0) on the old head's device; the word embeddings are untied.
    Returns the head's module name (its ``weight`` and ``bias`` in the state dict); ``ValueError`` without an output
    embedding."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head) to replace by a value head")
    name = next(n for n, module in model.named_modules() if module is head)
    value_head = torch.nn.Linear(head.in_features, 1, bias=True, device=head.weight.device, dtype=head.weight.dtype)
    if not head.weight.is_meta:
        torch.nn.init.zeros_(value_head.weight)
        torch.nn.init.zeros_(value_head.bias)
    model.set_output_embeddings(value_head)
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None and getattr(config, "tie_word_embeddings", False):
            config.tie_word_embeddings = False
    return name


class FSDPCritic(FSDPTrainable):
    """A sharded value model: ``compute_values`` and PPO's clipped value-loss updates; arguments as
    :class:`~easyrl.workers.trainable.FSDPTrainable`'s (``model_path``: the checkpoint whose backbone it starts from,
    ``config``: ``worker.critic``)."""

    def __init__(self, model_path: str, config: CriticConfig, mesh, device: str, torch_device: torch.device,
                 training_steps: int = 0):
        super().__init__(model_path, config, mesh, device, torch_device, trainable=True, offload=config.offload,
                         training_steps=training_steps)

    def _adapt_model(self, model: torch.nn.Module, full_state: dict[str, torch.Tensor]) -> None:
        """The value head on the meta model; on rank 0 the checkpoint's LM head replaced by the head's zeros."""
        name = attach_value_head(model)
        if full_state:
            head = model.get_output_embeddings()
            full_state[f"{name}.weight"] = torch.zeros(tuple(head.weight.shape), dtype=torch.float32)
            full_state[f"{name}.bias"] = torch.zeros(tuple(head.bias.shape), dtype=torch.float32)

    def _values(self, micro: Batch) -> torch.Tensor:
        """``(micro_bsz, resp_len)`` float32 values ``V(s_t)``, read where the actor reads token ``t``'s log-prob
        (packed or padded: ``worker.critic.padding_free``)."""
        return self._run_model(micro, lambda model, inputs: response_values(
            model, inputs, padding_free=self.config.padding_free, sp=self.sp))

    def compute_values(self, data: Batch, micro_batch_size: int) -> torch.Tensor:
        """Values of the response positions under the current weights, ``(bsz, resp_len)`` on the host, 0 at
        padding."""
        return self._score_responses(data, micro_batch_size, self._values)

    def update_critic(self, data: Batch, mini_batch_size: int, micro_batch_size: int) -> dict[str, list[float]]:
        """``ppo_epochs`` passes of clipped value-loss updates over this worker's share (``values``, ``returns``,
        ``response_mask``); sizes as :meth:`~easyrl.workers.policy.FSDPPolicy.update_policy`. Returns metric name ->
        values (``critic/vf_loss``, ``vf_clipfrac``, ``vpred_mean``, ``grad_norm``, ``lr``, ``skipped_steps``)."""
        return self.run_epochs(data, mini_batch_size, micro_batch_size, self._backward_micro_value, role="critic")

    def _backward_micro_value(self, indices: torch.Tensor, micro: Batch, agg_kwargs: dict,
                              step_metrics: dict[str, float]) -> None:
        cfg, dev = self.config, self.torch_device
        mask = micro["response_mask"].to(dev)
        vf_loss, metrics = compute_value_loss(
            self._values(micro), micro["returns"].to(dev), micro["values"].to(dev), mask,
            cliprange_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode, agg_kwargs=agg_kwargs,
        )
        vf_loss.backward()
        step_metrics["critic/vf_loss"] += vf_loss.item()
        share = token_share(mask, agg_kwargs)
        for key, value in metrics.items():
            step_metrics[f"critic/{key}"] += value * share
