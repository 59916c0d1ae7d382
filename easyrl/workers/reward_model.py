"""The FSDP2 reward model: a frozen Hugging Face sequence classifier with one output (e.g. Skywork-Reward-V2)
scoring (prompt, response) inputs the driver encoded with its own tokenizer (``easyrl.rewards.reward_model_inputs``).

Built like the reference policy (``easyrl.workers.fsdp_model``), held in ``param_dtype``. The score is the model's
``logits[:, 0]`` (pooled at the rightmost non-padding token, as transformers does).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from easyrl.batch import Batch
from easyrl.config import FSDPConfig, RewardModelConfig
from easyrl.errors import ModelError
from easyrl.workers.fsdp_model import TORCH_DTYPES, broadcast_weights, shard_model
from easyrl.workers.seqlen_balancing import count_micro_batches, dynamic_micro_batches

__all__ = ["FSDPRewardModel"]


class FSDPRewardModel:
    """A sharded, frozen reward model: :meth:`compute_scores` on a worker's share of the batch. ``pad_id``: the
    driver's padding id, the model's ``pad_token_id`` when its config has none. Raises ``ModelError`` unless the
    checkpoint is a sequence classifier with one output."""

    def __init__(self, config: RewardModelConfig, mesh, device: str, torch_device: torch.device, pad_id: int):
        from transformers import AutoConfig, AutoModelForSequenceClassification

        self.config = config
        self.torch_device = torch_device
        trust = config.trust_remote_code
        hf_config = AutoConfig.from_pretrained(config.model_path, trust_remote_code=trust)
        if getattr(hf_config, "num_labels", 1) != 1:
            raise ModelError(f"worker.reward.reward_model.model_path={config.model_path!r} has num_labels="
                             f"{hf_config.num_labels}; a reward model has one output (a scalar score per sequence)")
        if getattr(hf_config, "pad_token_id", None) is None:
            hf_config.pad_token_id = pad_id  # transformers pools at the rightmost non-padding token
        full_state, buffers = {}, {}
        if dist.get_rank() == 0:
            loaded = AutoModelForSequenceClassification.from_pretrained(
                config.model_path, config=hf_config, dtype=torch.float32, trust_remote_code=trust,
                attn_implementation="sdpa")
            full_state = loaded.state_dict()
            buffers = {name: buf.detach().clone() for name, buf in loaded.named_buffers()}
            del loaded
        with torch.device("meta"):
            model = AutoModelForSequenceClassification.from_config(
                hf_config, dtype=TORCH_DTYPES[config.param_dtype], trust_remote_code=trust, attn_implementation="sdpa")
        model.requires_grad_(False)
        shard_model(model, mesh, FSDPConfig(param_dtype=config.param_dtype, reduce_dtype="fp32"), device,
                    config.offload.offload_params)
        broadcast_weights(model, full_state, buffers)
        model.eval()
        self.model = model
        self.pad_id = int(hf_config.pad_token_id)

    def _micro_batches(self, data: Batch) -> list[list[int]]:
        """Index lists covering ``data``: ``micro_batch_size_per_device`` samples each, or with ``dynamic_batching``
        at most ``max_token_len_per_device`` tokens each; as many on every rank (a MAX all-reduce)."""
        cfg, n = self.config, len(data)
        if not cfg.dynamic_batching:
            size = cfg.micro_batch_size_per_device
            return [list(range(start, min(start + size, n))) for start in range(0, n, size)]
        lengths = data["attention_mask"].sum(-1).tolist()
        longest = data["attention_mask"].shape[1]
        budget = max(cfg.max_token_len_per_device or cfg.micro_batch_size_per_device * longest, max(lengths))
        count = torch.tensor(count_micro_batches(lengths, budget), device=self.torch_device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return dynamic_micro_batches(lengths, min(int(count.item()), n))

    @torch.no_grad()
    def compute_scores(self, data: Batch) -> torch.Tensor:
        """The reward model's ``(bsz,)`` float32 scores on the host of right-padded ``input_ids`` and
        ``attention_mask``, ``(bsz, seq_len)``."""
        out = torch.zeros(len(data), dtype=torch.float32)
        for indices in self._micro_batches(data):
            micro = data.select(indices)
            mask = micro["attention_mask"]
            width = int(mask.sum(-1).max().item())  # drop the columns that are padding in all rows
            mask = mask[:, :width].to(self.torch_device)
            ids = micro["input_ids"][:, :width].to(self.torch_device).masked_fill(mask == 0, self.pad_id)
            logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            out[indices] = logits[:, 0].float().cpu()
        return out
