"""Two gloo ranks with an FSDP2-sharded Qwen2 (``torchrun --nproc_per_node 2 fsdp_ranks.py MODEL_DIR OUT_DIR``):
saves a checkpoint with ``easyrl.workers.checkpoint.save_role``, loads it into a differently initialised copy with
``load_role``, and gathers the full weights with ``easyrl.workers.fsdp_model.gather_full_state_dict``. Each rank
writes ``OUT_DIR/rank_R.json`` with what it saw; rank 0 also saves the full weights it gathered to
``OUT_DIR/full.pt``."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoConfig, AutoModelForCausalLM


def build(model_dir: str, seed: int):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    # the attributes easyrl.workers.checkpoint reads of an FSDPPolicy (optimizer_to: states stay where they are)
    return SimpleNamespace(model=model, optimizer=optimizer, lr_scheduler=scheduler, num_updates=0,
                           consecutive_skips=0, torch_device=torch.device("cpu"), optimizer_to=lambda device: None)


def main() -> None:
    from easyrl.workers.fsdp_model import gather_full_state_dict
    from easyrl.workers.checkpoint import load_role, save_hf_metadata, save_role

    model_dir, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    policy = build(model_dir, seed=0)
    loss = policy.model(torch.arange(8)[None]).logits.square().mean()  # one real step: Adam moments are non-zero
    loss.backward()
    policy.optimizer.step()
    policy.lr_scheduler.step()
    policy.num_updates, policy.consecutive_skips = 7, 1
    ckpt = os.path.join(out, "global_step_1")
    save_role(policy, ckpt, rank)
    if rank == 0:
        save_hf_metadata(model_dir, model_dir, ckpt)
    dist.barrier()
    saved = gather_full_state_dict(policy.model)
    fresh = build(model_dir, seed=1)
    load_role(fresh, ckpt, rank)
    loaded = gather_full_state_dict(fresh.model)
    optim_equal = all(
        torch.equal(a["exp_avg"].to_local(), b["exp_avg"].to_local())
        for a, b in zip(policy.optimizer.state.values(), fresh.optimizer.state.values())
    )
    result = {"full_keys": len(saved), "loaded_equal": all(torch.equal(saved[k], loaded[k]) for k in saved),
              "optim_equal": optim_equal, "num_updates": fresh.num_updates, "skips": fresh.consecutive_skips,
              "scheduler_epoch": fresh.lr_scheduler.last_epoch}
    if rank == 0:
        torch.save(saved, os.path.join(out, "full.pt"))
    with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
