"""Two gloo ranks, one FSDP2-sharded tiny model (fp32, gradient checkpointing), the same batch scored and
differentiated twice (``torchrun --nproc_per_node 2 ulysses_ranks.py MODEL_DIR OUT_DIR``): data-parallel (each rank
half of the batch, no sequence parallelism) and with Ulysses over both ranks (each rank the whole batch, half of each
packed row). Rank 0 writes ``OUT_DIR/result.json``: the largest differences of the log-probs, entropies and full
gradients between the two, and the largest gradient (a scale for them)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from easyrl.models.fused_head import FusedLogProbHead
from easyrl.models.packed_attention import PACKED_SDPA
from easyrl.models.ulysses import attention_name, init_sequence_parallel
from easyrl.workers.policy_forward import ModelInputs, response_scores


def batch(bsz: int = 4, prompt: int = 7, response: int = 6, vocab: int = 200):
    """Left-padded prompts and right-padded responses of different lengths; the packed row (36 tokens) splits in
    the middle of row 1, whose later tokens then attend across the ranks."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (bsz, prompt + response), generator=gen)
    mask = torch.ones(bsz, prompt + response, dtype=torch.long)
    for row, (pad_left, resp_len) in enumerate([(0, 6), (1, 5), (3, 2), (4, 3)][:bsz]):
        mask[row, :pad_left] = 0
        mask[row, prompt + resp_len:] = 0
    advantages = torch.randn(bsz, response, generator=gen)
    return ids * mask, mask, mask[:, prompt:].clone(), advantages


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sp = init_sequence_parallel(world)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation=attention_name(PACKED_SDPA))
    sp.attach(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    head = FusedLogProbHead(model, chunk_tokens=3)
    ids, mask, response_mask, advantages = batch()

    def run(rows: slice, group):
        inputs = ModelInputs(ids[rows], mask[rows], response_mask[rows], {}, None)
        scores = response_scores(model, inputs, 1.0, with_entropy=True, entropy_grad=True, fused_head=head, sp=group)
        # the trainer's token-mean: the local sum over the global token count (all-reduced) x the data-parallel size
        tokens = response_mask[rows].sum().reshape(1)
        dist.all_reduce(tokens)
        scale = world / tokens.item()
        loss = -((scores.log_probs * advantages[rows] + 0.1 * scores.entropy) * response_mask[rows]).sum() * scale
        loss.backward()
        grads = {name: p.grad.full_tensor().clone() for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return scores.log_probs.detach(), scores.entropy.detach(), grads

    half = ids.shape[0] // world
    lp_half, ent_half, grads_dp = run(slice(rank * half, (rank + 1) * half), None)
    lp_sp, ent_sp, grads_sp = run(slice(None), sp)
    lp_dp, ent_dp = ([torch.empty_like(t) for _ in range(world)] for t in (lp_half, ent_half))
    dist.all_gather(lp_dp, lp_half)
    dist.all_gather(ent_dp, ent_half)
    lp_dp, ent_dp = torch.cat(lp_dp), torch.cat(ent_dp)
    result = {
        "log_prob_diff": (lp_dp - lp_sp).abs().max().item(),
        "entropy_diff": (ent_dp - ent_sp).abs().max().item(),
        "grad_diff": max((grads_dp[k] - grads_sp[k]).abs().max().item() for k in grads_dp),
        "grad_scale": max(g.abs().max().item() for g in grads_dp.values()),
        "log_prob_scale": lp_dp.abs().max().item(),
    }
    if rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
