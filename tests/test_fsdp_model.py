"""Loading and sharding (easyrl.workers.fsdp_model): placement decisions for every device x offload, the actor
loaded from rank 0's checkpoint, the reference built from the actor's shards in the compute dtype, and the sharded
gradient-norm clipping against torch's on the full model (2 gloo ranks)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from easyrl.config import ActorConfig, OffloadConfig
from easyrl.workers import fsdp_model
from easyrl.workers.fsdp_model import (
    clip_grad_norm,
    gather_full,
    load_sharded_model,
    param_device,
)


@pytest.mark.parametrize("device, offload, expected", [
    ("cuda", True, "cpu"), ("cuda", False, "cuda"), ("npu", True, "cpu"), ("npu", False, "npu"),
    ("cpu", True, "cpu"), ("cpu", False, "cpu"),
])
def test_parameters_on_the_host_only_when_offloading_from_an_accelerator(device, offload, expected):
    assert param_device(device, offload) == expected


def test_one_dtype_table_names_torch_s_dtypes_and_their_sizes():
    """``easyrl.config.role.DTYPES`` is the one table; the torch dtypes, the sizing's bytes and the config's choices are
    read from it, and its byte counts are torch's."""
    from typing import get_args, get_type_hints

    from easyrl.config.judge import JudgeConfig
    from easyrl.config.role import DTYPES, Dtype
    from easyrl.sizing.anatomy import DTYPE_BYTES

    assert get_args(Dtype) == tuple(DTYPES) == ("bf16", "fp16", "fp32")
    assert get_args(get_type_hints(JudgeConfig)["dtype"]) == ("auto", *DTYPES)
    assert {name: dtype.itemsize for name, dtype in fsdp_model.TORCH_DTYPES.items()} == DTYPE_BYTES == {
        "bf16": 2, "fp16": 2, "fp32": 4}


def test_placement_rejects_unknown_device():
    with pytest.raises(ValueError, match="tpu"):
        param_device("tpu", False)


def _actor_config(model_path, param_dtype: str) -> ActorConfig:
    config = ActorConfig()
    config.model.model_path = str(model_path)
    config.fsdp.param_dtype = param_dtype
    config.fsdp.enable_gradient_checkpointing = False
    return config


@pytest.mark.parametrize("arch, param_dtype", [("qwen2_5", "bf16"), ("qwen2_5_vl", "fp32")])
def test_actor_from_checkpoint_and_reference_from_actor_shards(process_group, tiny_model_path, monkeypatch,
                                                               arch, param_dtype):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoConfig

    path = tiny_model_path(arch)
    hf_config = AutoConfig.from_pretrained(path)
    config = _actor_config(path, param_dtype)
    mesh = init_device_mesh("cpu", (1,))
    actor = load_sharded_model(str(path), hf_config, config, mesh, "cpu", True, OffloadConfig())
    reference = fsdp_model.hf_model_class(hf_config).from_pretrained(path, dtype=torch.float32)
    expected = reference.state_dict()
    actor_state = {k: gather_full(v, torch.device("cpu")) for k, v in actor.state_dict().items()}
    assert actor_state.keys() == expected.keys()
    for name, value in expected.items():
        assert actor_state[name].dtype == torch.float32
        assert torch.equal(actor_state[name], value), name
    for (name, buf), (_, ref_buf) in zip(actor.named_buffers(), reference.named_buffers()):
        assert torch.equal(buf, ref_buf), name  # rotary inv_freq: not in the checkpoint, taken from rank 0's model

    def no_second_read(*args, **kwargs):
        raise AssertionError("the reference policy read the checkpoint again")

    monkeypatch.setattr(fsdp_model, "read_checkpoint", no_second_read)
    ref = load_sharded_model(str(path), hf_config, config, mesh, "cpu", False, OffloadConfig(offload_params=True),
                             init_from=actor)
    compute_dtype = fsdp_model.TORCH_DTYPES[param_dtype]
    for name, value in ref.state_dict().items():
        full = gather_full(value, torch.device("cpu"))
        assert full.dtype == compute_dtype, name
        assert torch.equal(full, expected[name].to(compute_dtype)), name
    assert not any(p.requires_grad for p in ref.parameters())
    for (name, buf), (_, actor_buf) in zip(ref.named_buffers(), actor.named_buffers()):
        assert torch.equal(buf, actor_buf), name


def _grad_norm_rank(rank: int, world: int, store: str, results) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))  # same init on both ranks
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    inputs = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))  # each rank its own data
    model(inputs).pow(2).sum().backward()
    norm = clip_grad_norm(model.parameters(), 0.5, torch.device("cpu"))
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    # the weight sync's one-collective bucket gather rebuilds FSDP2's uneven row shards (5 rows over 2 ranks: 3 + 2)
    from easyrl.workers.weight_sync import gather_bucket

    state = model.state_dict()
    bucket = gather_bucket(list(state.values()), torch.device("cpu"), torch.float32)
    same = all(torch.equal(full, value.full_tensor()) for full, value in zip(bucket, state.values()))
    if rank == 0:
        results.put((norm.item(), {name: g.tolist() for name, g in grads.items()}, same))
    dist.barrier()  # neither rank tears gloo down while the other still uses it (SIGABRT at exit under load)
    dist.destroy_process_group()


def test_sharded_grad_norm_and_bucket_gather_on_two_ranks(tmp_path):
    world = 2
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    store = str(tmp_path / "store")
    procs = [ctx.Process(target=_grad_norm_rank, args=(r, world, store, results)) for r in range(world)]
    for p in procs:
        p.start()
    norm, grads, bucket_gather_exact = results.get(timeout=120)
    assert bucket_gather_exact
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    # the same model unsharded, fed both ranks' data; FSDP2 averages gradients over ranks
    torch.manual_seed(0)
    full = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    loss = sum(full(torch.randn(4, 6, generator=torch.Generator().manual_seed(r))).pow(2).sum() for r in range(world))
    (loss / world).backward()
    expected_norm = torch.nn.utils.clip_grad_norm_(full.parameters(), 0.5).item()
    assert norm == pytest.approx(expected_norm, rel=1e-5)
    assert norm > 0.5  # so the clipping below really scaled the gradients
    for name, param in full.named_parameters():
        torch.testing.assert_close(torch.tensor(grads[name]), param.grad, rtol=1e-5, atol=1e-6)
