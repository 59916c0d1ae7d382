"""The accelerators easyrl knows, one table (:data:`DEVICES`); imports nothing heavy (``easyrl simulate --help``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from easyrl import envvars


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: ``kind`` (``cuda`` / ``npu``), ``name`` as the driver reports it, ``peak_tflops`` (dense BF16
    peak from the data sheet), ``marker`` (a substring of the driver's name, longest first) and ``memory_gib`` (total
    memory as the driver reports it, MiB / 1024; None: not simulated)."""

    kind: str
    name: str
    peak_tflops: float
    marker: str
    memory_gib: Optional[float] = None


DEVICES: dict[str, DeviceSpec] = {
    "h100": DeviceSpec("cuda", "NVIDIA H100 80GB HBM3", 989.0, "H100", 79.2),  # SXM; 81559 MiB
    "h100-pcie": DeviceSpec("cuda", "NVIDIA H100 PCIe", 756.0, "H100 PCIe"),
    "h100-nvl": DeviceSpec("cuda", "NVIDIA H100 NVL", 835.0, "H100 NVL"),
    "h800": DeviceSpec("cuda", "NVIDIA H800", 989.0, "H800"),  # SXM
    "h800-pcie": DeviceSpec("cuda", "NVIDIA H800 PCIe", 756.0, "H800 PCIe"),
    "h200": DeviceSpec("cuda", "NVIDIA H200", 989.0, "H200", 139.8),  # 143171 MiB
    "h20": DeviceSpec("cuda", "NVIDIA H20", 148.0, "H20"),
    "a100-40": DeviceSpec("cuda", "NVIDIA A100-SXM4-40GB", 312.0, "A100", 39.4),  # 40338 MiB usable of 40960
    "a100-80": DeviceSpec("cuda", "NVIDIA A100-SXM4-80GB", 312.0, "A100", 79.1),  # 81038 MiB usable of 81920
    "a800": DeviceSpec("cuda", "NVIDIA A800", 312.0, "A800"),
    "l20": DeviceSpec("cuda", "NVIDIA L20", 119.5, "L20"),
    "l40s": DeviceSpec("cuda", "NVIDIA L40S", 362.0, "L40S"),
    "b200": DeviceSpec("cuda", "NVIDIA B200", 2250.0, "B200"),
    "910b": DeviceSpec("npu", "Ascend910B3", 354.0, "910B", 64.0),  # FP16 cube peak, as verl lists it; 65536 MiB
}
SIMULATED = sorted(name for name, spec in DEVICES.items() if spec.memory_gib is not None)
"""The devices ``easyrl simulate --device`` offers (those with a known memory)."""
DEFAULT_DEVICE = {"cuda": "h100", "npu": "910b", "auto": "h100", "cpu": "h100"}
"""``easyrl simulate``'s device for each ``trainer.device``."""


def peak_flops(device_name: str) -> Optional[float]:
    """Peak FLOP/s of one device named ``device_name`` (``torch.cuda.get_device_name()``); ``EASYRL_PEAK_TFLOPS``
    overrides (``easyrl.envvars.peak_tflops``, read before Ray); None when unknown (the CPU, unlisted accelerators):
    no MFU then."""
    stated = envvars.peak_tflops(os.environ)
    if stated is not None:
        return stated * 1e12
    for spec in sorted(DEVICES.values(), key=lambda s: len(s.marker), reverse=True):
        if spec.marker.lower() in device_name.lower():
            return spec.peak_tflops * 1e12
    return None
