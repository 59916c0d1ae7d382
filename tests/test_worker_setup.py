"""Worker decisions that need no Ray or model: which policies a worker builds, and its Ray resources."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from easyrl.config import load_config
from easyrl.device import collective_backend, ray_actor_resources
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.group import method_name, node_contiguous_bundles

DEMO = f"config={Path(__file__).resolve().parents[1] / 'examples/configs/cpu_demo.yaml'}"


@pytest.mark.parametrize("overrides, needs_ref", [
    ([], True),
    (["algorithm.disable_kl=true"], False),
    (["algorithm.use_kl_loss=false"], False),
    (["algorithm.use_kl_loss=false", "algorithm.use_kl_in_reward=true"], True),
    (["worker.actor.model.lora.rank=4"], False),  # LoRA: the reference is the actor with its adapter off
])
def test_reference_model_only_when_a_kl_term_uses_it(overrides, needs_ref):
    config = load_config([DEMO, "worker.actor.model.model_path=m", *overrides])
    assert config.builds_reference is needs_ref


def test_workers_are_called_by_method_not_by_name():
    assert method_name(FSDPWorker.save_checkpoint) == "save_checkpoint"
    with pytest.raises(TypeError, match="FSDPWorker.save_checkpoint"):
        method_name("save_checkpoint")


def test_device_backends_and_resources():
    assert [collective_backend(d) for d in ("cuda", "npu", "cpu")] == ["nccl", "hccl", "gloo"]
    assert ray_actor_resources("cuda")["num_gpus"] == 1
    assert ray_actor_resources("npu")["resources"] == {"NPU": 1}
    with pytest.raises(ValueError, match="trainer.device"):
        collective_backend("tpu")


@pytest.mark.parametrize("bundle_nodes, expected", [
    ({0: "a", 1: "a"}, [0, 1]),  # one node: bundle order
    ({0: "a", 1: "b", 2: "a", 3: "b"}, [0, 2, 1, 3]),  # interleaved by PACK: node a's ranks first
    ({0: "b", 1: "a", 2: "a", 3: "b"}, [0, 3, 1, 2]),  # bundle 0's node holds rank 0
])
def test_ranks_are_node_contiguous(bundle_nodes, expected):
    order = node_contiguous_bundles(bundle_nodes)
    assert order == expected



def test_cpu_threads_per_worker_sets_threads_and_reserved_cpus():
    from easyrl.workers.group import _actor_resources, _bundle, worker_runtime_env

    assert _actor_resources("cpu", 2)["num_cpus"] == 2 and _bundle("cpu", 2) == {"CPU": 2.0}
    assert worker_runtime_env("cpu", 2, {})["OMP_NUM_THREADS"] == "2"
    assert _actor_resources("cuda", 1) == {"num_gpus": 1, "num_cpus": 1}  # GPU workers without offload: one core
    assert worker_runtime_env("cuda", 1, {})["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_offloaded_adam_gets_the_nodes_cpus(device):
    """#20: with offload_params the actor's Adam step runs on the host; Ray's one CPU per actor made it one thread.
    The worker now gets an equal share of the node's CPUs (one kept back), as Ray CPUs and as OMP_NUM_THREADS."""
    from easyrl.workers.group import _actor_resources, worker_cpu_threads, worker_runtime_env

    threads = worker_cpu_threads(device, offload=True, cpus_per_node=64, workers_per_node=8)
    assert threads == 7
    assert _actor_resources(device, threads)["num_cpus"] == 7
    assert worker_runtime_env(device, threads, {})["OMP_NUM_THREADS"] == "7"
    assert worker_cpu_threads(device, offload=False, cpus_per_node=64, workers_per_node=8) == 1
    assert worker_cpu_threads(device, offload=True, cpus_per_node=8, workers_per_node=8) == 1  # never 0
    assert worker_cpu_threads("cpu", offload=True, cpus_per_node=64, workers_per_node=8, cpu_threads_per_worker=2) == 2


def test_npu_workers_turn_vllm_ascend_nz_mode_off():
    """vllm-ascend refuses wake_up while VLLM_ASCEND_ENABLE_NZ (default 1) keeps weights in FRACTAL_NZ (#20)."""
    from easyrl.workers.group import worker_runtime_env

    assert worker_runtime_env("npu", 1, {})["VLLM_ASCEND_ENABLE_NZ"] == "0"
    assert "VLLM_ASCEND_ENABLE_NZ" not in worker_runtime_env("cuda", 1, {})


def test_worker_env_vars_from_the_config_reach_the_workers_and_win():
    from easyrl.workers.group import worker_runtime_env

    env = worker_runtime_env("npu", 1, {"HCCL_CONNECT_TIMEOUT": "1800", "LD_PRELOAD": "/lib/libjemalloc.so.2",
                                "VLLM_LOGGING_LEVEL": "DEBUG"})
    assert env["HCCL_CONNECT_TIMEOUT"] == "1800" and env["LD_PRELOAD"] == "/lib/libjemalloc.so.2"
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG"  # the user's value over easyrl's default (WARNING)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


R570 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Mar 14 2025\nGCC version: gcc 11.4.0\n"
R580 = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder)\n"


@pytest.mark.parametrize("driver, torch_cuda, refused", [
    (R570, "13.0", True), (R580, "13.0", False), (R570, "12.8", False),  # the locked torch 2.13 is CUDA 13: R580+
    (None, "13.0", False), (R570, None, False), ("garbled", "13.0", False), (R570, "14.0", False),  # unknown: no claim
])
def test_the_cuda_driver_check_refuses_a_driver_older_than_torchs_cuda(driver, torch_cuda, refused):
    from easyrl.device import cuda_driver_problem

    problem = cuda_driver_problem(driver, torch_cuda)
    assert (problem is not None) == refused
    if refused:
        assert "needs an NVIDIA driver 580 or newer; this host has 570.133.20" in problem


def test_preflight_and_the_cuda_workers_check_the_driver(tmp_path, monkeypatch):
    from easyrl import device
    from easyrl.errors import ConfigError
    from easyrl.trainer.preflight import check_cuda_driver

    (tmp_path / "version").write_text(R570)
    monkeypatch.setattr(device, "NVIDIA_DRIVER_FILE", str(tmp_path / "version"))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    for kind in ("cuda", "auto"):
        with pytest.raises(ConfigError, match=rf"^trainer.device={kind}: torch .* CUDA 13.0, which needs .* 580"):
            check_cuda_driver(kind)
    with pytest.raises(RuntimeError, match="570.133.20: upgrade the driver"):
        device.set_device("cuda")
    check_cuda_driver("npu")
    (tmp_path / "version").write_text(R580)
    check_cuda_driver("cuda")
