"""Stand-ins for the accelerator outside tensors (a device of ``easyrl.sizing.devices.DEVICES``): the CUDA runtime
calls FSDP2 and easyrl make, DTensor's shard offsets and the device's attention kernels; the tensors' side is
``easyrl.simulate.fake_device``."""

from __future__ import annotations

import contextlib
from typing import Iterator
from unittest import mock

import torch

from easyrl.sizing.anatomy import GIB
from easyrl.sizing.devices import DeviceSpec


class _Stream:
    """Stand-in for ``torch.cuda.Stream`` / ``Event``: every method is a no-op (one simulated stream)."""

    def __init__(self, *args, **kwargs):
        self.device = torch.device("cuda", 0)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@contextlib.contextmanager
def accelerator_standins(spec: DeviceSpec, fused_attention: bool = True) -> Iterator[None]:
    """Replace the CUDA runtime calls made outside tensors (current device, device count, streams, events, memory
    queries) by stand-ins for one visible ``spec`` device. ``torch.cuda.is_available`` is kept (False): random
    initialisation would otherwise call the CUDA RNG. With ``fused_attention`` (the default) the models built and run
    inside use the device's attention kernels (``easyrl.simulate.attention.device_attention``), not the math path."""
    cuda = torch.cuda
    props = mock.Mock(total_memory=int(spec.memory_gib * GIB), name=spec.name)
    patches = dict(current_device=lambda: 0, device_count=lambda: 1, set_device=lambda *a, **k: None,
                   Stream=_Stream, Event=_Stream, current_stream=lambda *a, **k: _Stream(),
                   default_stream=lambda *a, **k: _Stream(), stream=lambda *a, **k: contextlib.nullcontext(),
                   synchronize=lambda *a, **k: None, empty_cache=lambda: None,
                   get_device_properties=lambda *a, **k: props, get_device_name=lambda *a, **k: spec.name,
                   get_device_capability=lambda *a, **k: (9, 0),
                   memory_allocated=lambda *a, **k: 0, max_memory_allocated=lambda *a, **k: 0,
                   max_memory_reserved=lambda *a, **k: 0)
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch.object(cuda, name, value))
        _patch_shard_offsets(stack)
        if fused_attention:
            from easyrl.simulate.attention import device_attention

            stack.enter_context(device_attention(spec.kind))
        yield


def _patch_shard_offsets(stack: contextlib.ExitStack) -> None:
    """DTensor computes a shard's global offset with small index tensors and ``int()``, which a fake tensor cannot
    answer (data-dependent): run that computation (shapes and the mesh only) on real tensors, wherever imported."""
    import sys

    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.tensor import _utils

    original = _utils.compute_local_shape_and_global_offset

    def real_offsets(*args, **kwargs):
        with unset_fake_temporarily():
            return original(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "compute_local_shape_and_global_offset",
                                                            None) is original:
            stack.enter_context(mock.patch.object(module, "compute_local_shape_and_global_offset", real_offsets))


