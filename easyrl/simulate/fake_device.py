"""Simulated devices: one process as one rank of the config's world on fake accelerator tensors (the fake process
group, ``FakeTensorMode``, :class:`SimulatedDevice` above it) and stand-ins for the accelerator outside tensors (the
CUDA runtime, DTensor's shard offsets, attention kernels); device errors become a :class:`DeviceCheckError` naming
the innermost easyrl call. How and why: docs/simulate.md, "What makes a CPU act as a cluster"."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
import weakref
from typing import Callable, Iterator, Optional
from unittest import mock

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import (
    FakeTensor,
    FakeTensorDeviceMismatchError,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from easyrl.sizing.anatomy import GIB
from easyrl.sizing.devices import DeviceSpec


class DeviceCheckError(RuntimeError):
    """A host tensor reached a device op or a collective (names the easyrl call): the real device would fail."""


class HostTensorInCollective(RuntimeError):
    """A collective was given a host tensor while the process group runs on an accelerator (NCCL/HCCL)."""


BACKEND_NAMES = {"cuda": "NCCL", "npu": "HCCL"}
SHADOW_LIMIT = 1 << 24  # elements: small tensors (ids, masks, positions, counts) carry real values; weights never


class SimulatedDevice(TorchDispatchMode):
    """Above ``FakeTensorMode``: real values ("shadows") for small data tensors (ids, masks, what is computed from
    them), so data-dependent code runs unchanged; the collective check (:class:`HostTensorInCollective` for a tensor
    not on ``device_type``); and memory accounting of every ``device_type`` storage until freed (``allocated``,
    ``peak`` bytes). A host/device mix is left to ``FakeTensorMode`` (``FakeTensorDeviceMismatchError``)."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type = device_type
        self.shadows: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # id(fake) -> (the fake, its real value)
        self.sizes: dict[int, int] = {}  # live device storage (StorageImpl address) -> bytes
        self.allocated = 0
        self.peak = 0
        self.kinds = {"cpu", device_type}

    # memory -------------------------------------------------------------------------------------------------
    def reset_peak(self) -> None:
        self.peak = self.allocated

    def _track(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage until it is freed (a DTensor: its local tensor; only fake tensors count)."""
        if isinstance(tensor, DTensor):  # made inside DTensor's dispatch, below this mode: count its local tensor
            tensor = tensor._local_tensor
        if type(tensor) is not FakeTensor or tensor.device.type != self.device_type:
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.sizes:
            return
        self.sizes[key] = storage.nbytes()
        self.allocated += self.sizes[key]
        self.peak = max(self.peak, self.allocated)
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.allocated -= self.sizes.pop(key, 0)

    def resized(self, storage, nbytes: int) -> None:
        """``UntypedStorage.resize_`` on a tracked storage (FSDP2 frees and re-allocates unsharded parameters)."""
        key = storage._cdata
        if key in self.sizes:
            self.allocated += nbytes - self.sizes[key]
            self.sizes[key] = nbytes
            self.peak = max(self.peak, self.allocated)

    # dispatch -----------------------------------------------------------------------------------------------
    def _real(self, tensor: torch.Tensor) -> Optional[torch.Tensor]:
        if not isinstance(tensor, FakeTensor):
            return tensor if type(tensor) is torch.Tensor and tensor.device.type == "cpu" else None
        ref, real = self.shadows.get(id(tensor), (None, None))
        return real if ref is not None and ref() is tensor else None

    def _set_shadow(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        key = id(fake)
        self.shadows[key] = (weakref.ref(fake), real)
        weakref.finalize(fake, self.shadows.pop, key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "namespace", "") in ("c10d", "_c10d_functional"):
            self._check_collective(func, args, kwargs)
            return self._tracked(func(*args, **kwargs))
        if func is torch.ops.inductor.resize_storage_bytes_.default:  # FSDP2 frees/re-allocates unsharded params
            out = func(*args, **kwargs)
            self.resized(args[0].untyped_storage(), args[1])
            return out
        if func in (torch.ops.aten._pin_memory.default, torch.ops.aten.is_pinned.default):
            # FakeTensorMode has no pinned memory (NYI): a host-offloaded shard is pinned host memory, not device
            return args[0] if func is torch.ops.aten._pin_memory.default else True
        if getattr(func, "namespace", "") == "prim":  # metadata (device, ...): the fake tensor answers
            return func(*args, **kwargs)
        inputs = _tensors(args) + _tensors(kwargs)
        reals = [self._real(t) for t in inputs]
        devices = {t.device.type for t in inputs if t.dim() > 0}
        if inputs and all(r is not None for r in reals) and len(devices) <= 1 and devices <= self.kinds \
                and sum(t.numel() for t in inputs) <= SHADOW_LIMIT:
            try:
                return self._run_real(func, args, kwargs, inputs, reals)
            except RuntimeError:  # an op that cannot run on host copies (storage surgery, ...) stays fake
                pass
        if func is torch.ops.aten._local_scalar_dense.default:
            # a number computed from weights or activations (a loss, a gradient norm): its value is not simulated;
            # it reads 0 (finite: the optimizer step runs; False: no branch on an unknown condition)
            return {torch.bool: False}.get(args[0].dtype, 0.0 if args[0].is_floating_point() else 0)
        try:
            out = func(*args, **kwargs)
        except ValueError as err:  # FakeTensor's view raises ValueError where a device tensor raises RuntimeError
            raise RuntimeError(str(err)) from err  # (easyrl's token ops catch the latter: padded logits slices)
        self._drop_written_shadows(func, args, kwargs)
        if not inputs and func is not torch.ops.aten._local_scalar_dense.default:
            self._shadow_factory(func, args, kwargs, out)
        return self._tracked(out)

    def _drop_written_shadows(self, func, args, kwargs) -> None:
        """A fake op wrote into its arguments (in place, ``out=``): their real values are stale now."""
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                for tensor in _tensors(value):
                    self.shadows.pop(id(tensor), None)

    def _check_collective(self, func, args, kwargs) -> None:
        for tensor in _tensors(args) + _tensors(kwargs):
            if tensor.device.type != self.device_type:
                raise HostTensorInCollective(
                    f"collective {func} got a tensor on '{tensor.device}' (shape {tuple(tensor.shape)}): the real "
                    f"process group ({BACKEND_NAMES.get(self.device_type, 'gloo')}) takes '{self.device_type}' "
                    "tensors only")

    def _tracked(self, out):
        for tensor in _tensors(out):
            self._track(tensor)
        return out

    def _run_real(self, func, args, kwargs, inputs, reals):
        swap = {id(t): r for t, r in zip(inputs, reals)}
        back = {id(r): t for t, r in zip(inputs, reals)}
        target = kwargs.get("device") if func is torch.ops.aten._to_copy.default else None
        target = torch.device(target) if target is not None else next(
            (t.device for t in inputs if t.device.type != "cpu"), torch.device("cpu"))
        real_kwargs = dict(tree_map(lambda v: swap.get(id(v), v), kwargs))
        if "device" in real_kwargs:
            real_kwargs["device"] = torch.device("cpu")
        with unset_fake_temporarily():
            out = func(*tree_map(lambda v: swap.get(id(v), v), args), **real_kwargs)

        def place(value):
            if not isinstance(value, torch.Tensor):
                return value
            if id(value) in back:  # in place, or the input itself
                return back[id(value)]
            if target.type == "cpu":
                return value
            fake = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=target)
            self._set_shadow(fake, value)
            self._track(fake)
            return fake

        return tree_map(place, out)

    def _shadow_factory(self, func, args, kwargs, out) -> None:
        if not isinstance(out, FakeTensor) or out.numel() > SHADOW_LIMIT or out.device.type not in self.kinds \
                or out.is_floating_point() or out.is_complex():
            return  # weights, activations and their buffers: never data (and a host copy would cost real memory)
        with unset_fake_temporarily():
            try:
                self._set_shadow(out, func(*args, **dict(kwargs, device=torch.device("cpu"))))
            except Exception:  # noqa: BLE001 - a factory we cannot mirror stays fake
                pass


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def culprit(exc: BaseException) -> str:
    """``file:line in function: source`` of ``exc``'s innermost easyrl frame outside ``easyrl/simulate`` (else
    outside torch; ``?`` without one)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(here)]
    ours = [f for f in frames if f.filename.startswith(root)]
    frame = (ours or [f for f in frames if os.sep + "torch" + os.sep not in f.filename] or frames or [None])[-1]
    if frame is None:
        return "?"
    where = os.path.relpath(frame.filename, os.path.dirname(root)) if ours else frame.filename
    return f"{where}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"


@contextlib.contextmanager
def device_check(phase: str) -> Iterator[None]:
    """A host/device mix or a host tensor in a collective becomes a :class:`DeviceCheckError` naming ``phase`` and
    the easyrl call."""
    try:
        yield
    except (FakeTensorDeviceMismatchError, HostTensorInCollective) as exc:
        kind = "host tensor in a collective" if isinstance(exc, HostTensorInCollective) else "host/device mix"
        raise DeviceCheckError(f"phase '{phase}': {kind} at {culprit(exc)}\n  {str(exc).splitlines()[0]}") from exc


@contextlib.contextmanager
def fake_world(rank: int, world_size: int, device_type: str = "cuda") -> Iterator[None]:
    """This process as ``rank`` of ``world_size`` over the fake process group, bound to ``device_type`` only (as NCCL
    to ``cuda``: a group that also claimed ``cpu`` would take host tensors NCCL never sees)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    dist.init_process_group(f"{device_type}:fake", store=FakeStore(), rank=rank, world_size=world_size)
    # object collectives (broadcast_object_list, ...) pick their tensors' device from the backend: NCCL's is the
    # accelerator, the fake backend's the host (which the collective check would refuse)
    try:
        with mock.patch.object(dist.distributed_c10d, "_get_object_coll_device", lambda group=None: device_type):
            yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def fake_tensors(device_type: Optional[str]) -> Iterator["SimulatedDevice"]:
    """``FakeTensorMode`` (earlier host tensors accepted as inputs) under a :class:`SimulatedDevice`."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        mode = SimulatedDevice(device_type or "cpu")
        original_resize = torch.UntypedStorage.resize_

        def resize(storage, nbytes):
            result = original_resize(storage, nbytes)
            mode.resized(storage, nbytes)
            return result

        with mock.patch.object(torch.UntypedStorage, "resize_", resize), \
                mock.patch.object(torch, "tensor", _tensor_of_scalars), mode:
            yield mode


_torch_tensor = torch.tensor


def _tensor_of_scalars(data, *args, **kwargs):
    """``torch.tensor`` reading 0-dim tensor elements as numbers first (under a dispatch mode
    ``torch.tensor([float_tensor], dtype=torch.int64)`` fails, where plain PyTorch accepts it)."""
    if isinstance(data, (list, tuple)) and any(isinstance(v, torch.Tensor) and v.dim() == 0 for v in data):
        data = [v.item() if isinstance(v, torch.Tensor) and v.dim() == 0 else v for v in data]
    return _torch_tensor(data, *args, **kwargs)


def fake_checkpoint_reader(model_path: str, hf_config, trust_remote_code: bool, lora=None) -> tuple[dict, dict]:
    """Stand-in for ``easyrl.workers.fsdp_model.read_checkpoint`` on rank 0 (under ``FakeTensorMode``): the same
    names, shapes and dtypes (with ``lora`` peft's names) as fake tensors, no weights read."""
    from easyrl.sizing.anatomy import meta_model

    model = meta_model(hf_config, trust_remote_code)
    if lora is not None:
        from easyrl.models.lora import apply_lora

        apply_lora(model, lora, model_path)
    return fake_state(model)


def fake_state(model: torch.nn.Module) -> tuple[dict, dict]:
    """``(state dict, buffers)`` of ``model`` (a meta-device build) as new tensors of the same shapes and dtypes."""
    state = {name: torch.empty(t.shape, dtype=t.dtype) for name, t in model.state_dict().items()}
    return state, {name: torch.empty(b.shape, dtype=b.dtype) for name, b in model.named_buffers()}


class _Stream:
    """Stand-in for a ``torch.cuda.Stream`` / ``Event``: every method is a no-op (one simulated stream). A class,
    so that a module imported meanwhile can still write ``torch.cuda.Stream | None`` in an annotation."""

    def __new__(cls, *args, **kwargs) -> mock.MagicMock:
        return mock.MagicMock(device=torch.device("cuda", 0))


@contextlib.contextmanager
def accelerator_standins(spec: DeviceSpec, fused_attention: bool = True) -> Iterator[None]:
    """Inside: the CUDA runtime calls (device, streams, events, memory queries) answer for one ``spec`` device
    (``is_available`` answers False: initialisation would call the CUDA RNG, and torch's NVML-based check,
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` as vLLM sets it, would read the patched ``device_count``); with ``fused_attention`` the device's
    attention kernels (``easyrl.simulate.attention.device_attention``)."""
    cuda = torch.cuda
    props = mock.Mock(total_memory=int(spec.memory_gib * GIB), name=spec.name)
    patches = dict(is_available=lambda: False, current_device=lambda: 0, device_count=lambda: 1, set_device=lambda *a, **k: None,
                   Stream=_Stream, Event=_Stream, current_stream=_Stream, default_stream=_Stream,
                   stream=lambda *a, **k: contextlib.nullcontext(),
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


def outside_fake_mode(function: Callable) -> Callable:
    """``function`` run with fake tensors switched off (for small index tensors a fake one cannot answer, and for
    peft's ``apply_lora``)."""
    @functools.wraps(function)
    def real(*args, **kwargs):
        with unset_fake_temporarily():
            return function(*args, **kwargs)

    return real


def _patch_shard_offsets(stack: contextlib.ExitStack) -> None:
    """DTensor's shard offsets (``int()`` of small index tensors, which a fake tensor cannot answer) on real
    tensors, wherever imported."""
    from torch.distributed.tensor import _utils

    original = _utils.compute_local_shape_and_global_offset
    real_offsets = outside_fake_mode(original)
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "compute_local_shape_and_global_offset",
                                                            None) is original:
            stack.enter_context(mock.patch.object(module, "compute_local_shape_and_global_offset", real_offsets))
