"""Two gloo ranks under the collective contract (``torchrun --nproc_per_node 2 contract_ranks.py PLANT OUT_DIR``):
an FSDP2-sharded two-layer model runs a forward and backward, then an all-reduce, an ``all_gather_object`` and a
method end (``easyrl.workers.collectives``). ``PLANT`` breaks the symmetry: ``none``; ``skip`` (rank 1 skips an
all-gather before the forward); ``extra`` (rank 0 adds an all-gather at the end); ``tower`` (rank 0 runs its
first layer twice, as a micro-batch with images and videos ran the vision tower twice before S2-B was fixed). Each
rank writes ``OUT_DIR/rank_R.txt``: ``ok <calls checked>`` or the error's message."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from easyrl.workers import collectives


def step(plant: str, rank: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if not (plant == "skip" and rank == 1):
        dist.all_gather_single(torch.zeros(2 * dist.get_world_size()), torch.ones(2))
    x = torch.ones(3, 8)
    y = model(x)
    if plant == "tower" and rank == 0:
        y = y + 0 * model[0](x).sum()
    y.square().mean().backward()
    dist.all_reduce(torch.ones(3))
    dist.all_gather_object([None] * dist.get_world_size(), {"rank": rank})
    if plant == "extra" and rank == 0:
        dist.all_gather_single(torch.zeros(2 * dist.get_world_size()), torch.ones(2))


def main() -> None:
    plant, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    collectives.install()
    try:
        collectives.checked_call(sys.modules[__name__], "step", plant, rank)
        result = f"ok {sum(collectives._CONTRACT.calls.values())}"
    except collectives.CollectiveMismatch as err:
        result = str(err)
    with open(os.path.join(out, f"rank_{rank}.txt"), "w") as f:
        f.write(result)
    os._exit(0)  # a rank whose peer left mid-collective must not wait in destroy_process_group


if __name__ == "__main__":
    main()
