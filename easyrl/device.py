"""The hardware layer: which device a worker computes on and which collective backend connects the workers.

Three paths: NVIDIA GPUs (``cuda`` + NCCL), Ascend NPUs (``npu`` + HCCL, through ``torch_npu``), and the CPU
(``cpu`` + gloo), the last one for development and tests.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

BACKENDS = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}


def detect_device(cluster_resources: dict[str, float] | None = None) -> str:
    """The device kind of the cluster: ``cuda`` if Ray (or this process) sees GPUs, ``npu`` if it sees NPUs, else ``cpu``.
    ``cluster_resources``: ``ray.cluster_resources()``; when None, this process's own devices decide."""
    if cluster_resources is not None:
        if cluster_resources.get("GPU", 0) > 0:
            return "cuda"
        if cluster_resources.get("NPU", 0) > 0:
            return "npu"
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if importlib.util.find_spec("torch_npu") is not None:
        import torch_npu  # noqa: F401  (registers torch.npu)

        if torch.npu.is_available():
            return "npu"
    return "cpu"


def collective_backend(device: str) -> str:
    """``nccl`` / ``hccl`` / ``gloo`` for ``cuda`` / ``npu`` / ``cpu``. Raises ValueError for another name."""
    if device not in BACKENDS:
        raise ValueError(f"trainer.device must be one of auto, {', '.join(BACKENDS)}; got '{device}'.")
    return BACKENDS[device]


def ray_actor_resources(device: str) -> dict:
    """Ray ``.options(...)`` that give one worker one device (one CPU core on the CPU path)."""
    if device == "cuda":
        return {"num_gpus": 1, "num_cpus": 1}
    if device == "npu":
        return {"resources": {"NPU": 1}, "num_cpus": 1}
    return {"num_cpus": 1}


def torch_device(device: str) -> torch.device:
    """The ``torch.device`` a worker computes on (its one visible accelerator, or the CPU)."""
    if device == "cpu":
        return torch.device("cpu")
    return torch.device(device, 0) if device == "npu" else torch.device("cuda", torch.cuda.current_device())


def set_device(device: str) -> None:
    """Make the worker's one visible accelerator the current device (``torch.cuda.set_device`` /
    ``torch.npu.set_device``), before the process group starts; NCCL and HCCL bind to it. No-op on the CPU.

    Ray gives each worker one device (``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``), so it is index 0.
    """
    if device == "cuda":
        torch.cuda.set_device(0)
    elif device == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)

        torch.npu.set_device(0)


def _accelerator(device: str) -> Any:
    """``torch.cuda`` or ``torch.npu`` for ``cuda`` / ``npu``; None on the CPU."""
    return {"cuda": torch.cuda, "npu": getattr(torch, "npu", None)}.get(device)


def empty_cache(device: str) -> None:
    """Give cached accelerator memory back (no-op on the CPU)."""
    if device != "cpu":
        _accelerator(device).empty_cache()


def device_memory_gib(device: str) -> float:
    """Total memory of the worker's accelerator, in GiB (0 on the CPU, where the host's memory is shared)."""
    return 0.0 if device == "cpu" else _accelerator(device).get_device_properties(0).total_memory / 2**30


def device_name(device: str) -> str:
    """The accelerator's marketing name (``NVIDIA H100 80GB HBM3``, ``Ascend910B3``), or ``cpu``."""
    return "cpu" if device == "cpu" else _accelerator(device).get_device_name()


def memory_metrics(device: str) -> dict[str, float]:
    """This worker's memory, in GiB (2**30 bytes; the ``_gb`` suffix is the metric name).

    ``perf/max_memory_allocated_gb`` / ``perf/max_memory_reserved_gb``: the accelerator allocator's peaks since the
    worker started (tensors / cached blocks; only on cuda and npu, the CPU has no such allocator);
    ``perf/cpu_memory_used_gb``: the worker process's resident host memory now (RSS).
    """
    import psutil

    metrics = {"perf/cpu_memory_used_gb": psutil.Process().memory_info().rss / 2**30}
    if device != "cpu":
        module = _accelerator(device)
        metrics["perf/max_memory_allocated_gb"] = module.max_memory_allocated() / 2**30
        metrics["perf/max_memory_reserved_gb"] = module.max_memory_reserved() / 2**30
    return metrics
