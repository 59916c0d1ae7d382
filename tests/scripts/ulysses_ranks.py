"""Two gloo ranks, one FSDP2-sharded tiny model (fp32, gradient checkpointing), the same batch scored and
differentiated twice (``torchrun --nproc_per_node 2 ulysses_ranks.py MODEL_DIR OUT_DIR``): without sequence
parallelism (a text model: each rank half of the batch; a Qwen-VL model: each rank the whole batch with its images)
and with Ulysses over both ranks (each rank the whole batch, half of each packed row; the vision tower on both).
The loss also takes the critic's values (``response_values``, the output embedding's first column as a value head).
A mixture of experts replays one fixed routing (not its routers' own) in both runs (``router_replay``), and R2's
recording of its routers' own choices (gathered over the group with Ulysses) is compared too.
Rank 0 writes ``OUT_DIR/result.json``: the largest differences of the log-probs, entropies, values and full gradients
between the two, and the largest gradient (a scale for them)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoConfig, AutoProcessor

from easyrl.models.families import family
from easyrl.models.hf_folder import hf_model_class
from easyrl.models.router_replay import RouterReplay
from easyrl.models.fused_head import FusedLogProbHead
from easyrl.models.packed_attention import PACKED_SDPA
from easyrl.models.ulysses import attention_name, init_sequence_parallel
from easyrl.workers.policy_forward import ModelInputs, response_scores, response_values


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


def vl_batch(model_dir: str, model, response: int = 6):
    """Rows with an image, without one, with one after text (the packed row splits inside the second image's row)."""
    from PIL import Image

    processor = AutoProcessor.from_pretrained(model_dir)
    images = [Image.new("RGB", (56, 84), (200, 30, 60)), Image.new("RGB", (112, 56), (10, 220, 90))]
    texts = ["<|vision_start|><|image_pad|><|vision_end|>what is x?", "hi there, no image",
             "a<|vision_start|><|image_pad|><|vision_end|>find y"]
    rows, pixel_values, grids, image_iter = [], [], [], iter(images)
    for text in texts:
        imgs = [next(image_iter)] if "image_pad" in text else None
        out = processor(text=[text], images=imgs, return_tensors="pt")
        rows.append(out["input_ids"][0])
        if imgs:
            pixel_values.append(out["pixel_values"])
            grids.append(out["image_grid_thw"])
    prompt = max(len(r) for r in rows)
    gen = torch.Generator().manual_seed(0)
    ids = torch.zeros(len(rows), prompt + response, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (row, resp_len) in enumerate(zip(rows, (6, 4, 5))):
        ids[i, prompt - len(row):prompt], mask[i, prompt - len(row):prompt + resp_len] = row, 1
        ids[i, prompt:prompt + resp_len] = torch.randint(10, 200, (resp_len,), generator=gen)
    types = torch.zeros_like(ids)
    types[ids == model.config.image_token_id] = 1
    mm = {"pixel_values": torch.cat(pixel_values), "image_grid_thw": torch.cat(grids)}
    return ids, mask, mask[:, prompt:].clone(), torch.randn(len(rows), response, generator=gen), mm, types


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sp = init_sequence_parallel(world)
    hf_config = AutoConfig.from_pretrained(model_dir)
    model = hf_model_class(hf_config).from_pretrained(model_dir, dtype=torch.float32,
                                                      attn_implementation=attention_name(PACKED_SDPA))
    torch.manual_seed(0)
    with torch.no_grad():  # the tiny models' random init is near uniform: make log-probs and gradients informative
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    sp.attach(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh("cpu", (world,))
    for block in [m for m in model.modules() if type(m).__name__ in model._no_split_modules]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    head = FusedLogProbHead(model, chunk_tokens=3)
    is_vl = hasattr(hf_config, "vision_config")
    mm, types = {}, None
    if is_vl:
        ids, mask, response_mask, advantages, mm, types = vl_batch(model_dir, model)
    else:
        ids, mask, response_mask, advantages = batch()

    replay, routed = None, None
    if family(hf_config).router is not None:  # MoE: both runs replay one routing (not the routers' own)
        replay = RouterReplay(model, family(hf_config).router)
        layers, k, experts = hf_config.num_hidden_layers, hf_config.num_experts_per_tok, hf_config.num_experts
        position = torch.arange(ids.numel()).view(*ids.shape, 1, 1)
        routed = (position + torch.arange(layers).view(1, 1, -1, 1) + torch.arange(k).view(1, 1, 1, -1)) % experts
        routed = routed.masked_fill(~mask.bool()[..., None, None], -1).to(torch.int16)

    def run(rows: slice, group):
        inputs = ModelInputs(ids[rows], mask[rows], response_mask[rows], mm, None if types is None else types[rows],
                             None if routed is None else routed[rows])
        scores = response_scores(model, inputs, 1.0, with_entropy=True, entropy_grad=True, fused_head=head,
                                 sp=group, replay=replay)
        # the trainer's token-mean: the local sum over the global token count (all-reduced) x the data-parallel size
        # the critic's path: the output embedding's first column as a value head (logits, no fused head)
        values = response_values(model, inputs, padding_free=True, sp=group)
        tokens = response_mask[rows].sum().reshape(1)
        dist.all_reduce(tokens)
        scale = world / tokens.item()
        loss = -((scores.log_probs * advantages[rows] + 0.1 * scores.entropy - values.square()) *
                 response_mask[rows]).sum() * scale
        loss.backward()
        grads = {name: p.grad.full_tensor().clone() for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return torch.stack([scores.log_probs, scores.entropy, values]).detach(), grads

    def record(group):  # R2: the whole batch's own routing recorded, on each rank alone or over the group
        with torch.no_grad():
            return response_scores(model, ModelInputs(ids, mask, response_mask, mm, types, None), 1.0,
                                   with_entropy=False, entropy_grad=False, fused_head=head, sp=group, replay=replay,
                                   record=True).routing

    half = ids.shape[0] // world if not is_vl else 0  # a VL batch is not split: its images go with it whole
    scores_dp, grads_dp = run(slice(rank * half, (rank + 1) * half) if half else slice(None), None)
    alone = record(None) if replay is not None else None  # before any sharded forward (its slicing hook stays)
    scores_sp, grads_sp = run(slice(None), sp)
    if half:  # (3, bsz / 2, R) per rank -> (3, bsz, R)
        parts = [torch.empty_like(scores_dp) for _ in range(world)]
        dist.all_gather(parts, scores_dp)
        scores_dp = torch.cat(parts, dim=1)
    diff = (scores_dp - scores_sp).abs().flatten(1).max(dim=1).values.tolist()
    routing_mismatch = 0.0
    if replay is not None:
        shared = record(sp)
        routing_mismatch = (alone != shared).float().mean().item() + float(bool((alone[mask == 1] < 0).any()))
    result = {
        "log_prob_diff": diff[0], "entropy_diff": diff[1], "value_diff": diff[2],
        "grad_diff": max((grads_dp[k] - grads_sp[k]).abs().max().item() for k in grads_dp),
        "grad_scale": max(g.abs().max().item() for g in grads_dp.values()),
        "log_prob_scale": scores_dp[0].abs().max().item(), "routing_mismatch": routing_mismatch,
    }
    if rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
