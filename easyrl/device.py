"""The hardware layer: ``cuda`` + NCCL, ``npu`` + HCCL (``torch_npu``) or ``cpu`` + gloo (development and tests)."""

from __future__ import annotations

import importlib.util
import re
from typing import Any, Optional

import torch

BACKENDS = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}


def detect_device(cluster_resources: dict[str, float] | None = None) -> str:
    """``cuda``, ``npu`` or ``cpu``: what ``cluster_resources`` (``ray.cluster_resources()``) or, when None, this
    process sees."""
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


# CUDA major version -> the oldest NVIDIA driver branch that runs it (NVIDIA's CUDA toolkit release notes, table 3:
# CUDA 12.x >= 525.60.13 with minor-version compatibility, CUDA 13.x >= 580.65.06)
CUDA_MIN_DRIVER = {12: 525, 13: 580}
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"  # "NVRM version: NVIDIA UNIX ... Kernel Module  580.65.06  ..."


def cuda_driver_problem(driver_text: Optional[str], torch_cuda: Optional[str]) -> Optional[str]:
    """Why the driver of ``driver_text`` (``/proc/driver/nvidia/version``) cannot run ``torch_cuda``
    (``torch.version.cuda``), or None when it can or either is None."""
    found = re.search(r"\s(\d{3,})\.\d+(?:\.\d+)?\s", driver_text or "")
    need = CUDA_MIN_DRIVER.get(int(torch_cuda.split(".")[0])) if torch_cuda else None
    if found is None or need is None or int(found.group(1)) >= need:
        return None
    return (f"torch {torch.__version__} is built for CUDA {torch_cuda}, which needs an NVIDIA driver {need} or newer; "
            f"this host has {found.group(0).strip()}: upgrade the driver, or install a torch (and vLLM) built for the "
            f"host's CUDA (README, Running a real job)")


def host_cuda_driver_problem() -> Optional[str]:
    """:func:`cuda_driver_problem` for this host (reads :data:`NVIDIA_DRIVER_FILE`; None where it is absent)."""
    try:
        with open(NVIDIA_DRIVER_FILE) as f:
            text = f.read()
    except OSError:
        return None
    return cuda_driver_problem(text, torch.version.cuda)


def set_device(device: str) -> None:
    """Make the worker's one visible accelerator (index 0) current before the process group starts; no-op on the
    CPU. RuntimeError when the node's driver is too old for torch's CUDA."""
    if device == "cuda":
        problem = host_cuda_driver_problem()
        if problem:
            raise RuntimeError(problem)
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
    """This worker's memory in GiB: ``perf/max_memory_allocated_gb`` / ``_reserved_gb`` (the accelerator
    allocator's peaks; not on the CPU) and ``perf/cpu_memory_used_gb`` (the process's RSS now)."""
    import psutil

    metrics = {"perf/cpu_memory_used_gb": psutil.Process().memory_info().rss / 2**30}
    if device != "cpu":
        module = _accelerator(device)
        metrics["perf/max_memory_allocated_gb"] = module.max_memory_allocated() / 2**30
        metrics["perf/max_memory_reserved_gb"] = module.max_memory_reserved() / 2**30
    return metrics
