"""The one place for what differs between the vLLM lines easyrl reads (0.23, 0.32, 0.33): each call whose name,
arguments or location changed goes through a function here naming the lines it serves; a line-specific branch
tests :func:`vllm_version` or the engine's API. The rest is called directly (docs/vllm-versions.md); CPU-backend
workarounds live in ``easyrl.workers.vllm_cpu_fixes``. vLLM is never imported at module level.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator
from importlib import metadata
from typing import Any, Callable, Optional

import torch

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the GPU/NPU build and the CPU build install the same ``vllm`` package


@functools.cache
def vllm_version() -> Optional[tuple[int, int]]:
    """``(major, minor)`` of the installed vLLM (distribution ``vllm`` or ``vllm-cpu``), read once through
    ``importlib.metadata``; None when neither is installed. E.g. ``(0, 32)`` for ``vllm-cpu 0.32.0``."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        major, minor = (version.split("+")[0].split(".") + ["0"])[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
    return None


def returns_routed_experts() -> bool:
    """Whether this vLLM's engine takes ``enable_return_routed_experts`` (its GPU model runner then returns each
    request's experts, ``CompletionOutput.routed_experts``; vLLM 0.23 and 0.32)."""
    from vllm.engine.arg_utils import EngineArgs

    return "enable_return_routed_experts" in EngineArgs.__dataclass_fields__


# run vllm.LLM's engine core in the calling process (weights handed over as tensors); set before vLLM is imported.
# vLLM 0.23, 0.32 and 0.33 alike.
IN_PROCESS_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
IN_PROCESS_TRANSFER = "easyrl_in_process"  # the weight-transfer backend registered by ``weight_transfer_kwargs``


def weight_transfer_kwargs() -> dict[str, Any]:
    """``vllm.LLM`` arguments that let :func:`reload_weights` use vLLM's native weight-update calls where the
    worker has no ``reload_weights``; call before ``LLM(...)``. vLLM 0.23: registers
    :func:`in_process_transfer_engine`, returns ``weight_transfer_config={"backend": "easyrl_in_process"}``
    (vllm-ascend 0.23 needs it). vLLM 0.32 on: nothing."""
    if vllm_version() is None or vllm_version() >= (0, 24):
        return {}
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(IN_PROCESS_TRANSFER, in_process_transfer_engine())
    except ValueError:  # registered by an earlier engine of this process
        pass
    return {"weight_transfer_config": {"backend": IN_PROCESS_TRANSFER}}


@functools.cache
def in_process_transfer_engine() -> type:
    """vLLM 0.23's ``WeightTransferEngine`` for an engine in the trainer's own process: ``update_weights({"weights":
    iterator})`` hands the ``(HF name, full tensor)`` pairs to vLLM's loader by reference. Built on first use."""
    from dataclasses import dataclass

    from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                       WeightTransferUpdateInfo)

    @dataclass
    class InProcessUpdateInfo(WeightTransferUpdateInfo):
        weights: Any = None  # an iterator of (name, tensor), consumed once

    class InProcessWeightTransferEngine(WeightTransferEngine):
        init_info_cls = WeightTransferInitInfo
        update_info_cls = InProcessUpdateInfo

        def init_transfer_engine(self, init_info: Any) -> None:
            pass  # nothing to connect: the trainer is this process

        def receive_weights(self, update_info: Any, load_weights: Callable[..., Any]) -> None:
            load_weights(update_info.weights)

        def shutdown(self) -> None:
            pass

        @staticmethod
        def trainer_send_weights(*args: Any, **kwargs: Any) -> None:
            raise NotImplementedError("easyrl's in-process engine takes the tensors by reference: call "
                                      "update_weights({'weights': iterator}) inside the worker")

    return InProcessWeightTransferEngine


RELOAD_BY_COPY = {"GptOssForCausalLM": (".mlp.experts.", ".sinks")}
"""vLLM class -> the name parts of the weights its ``load_weights`` copies into the parameters (``param.copy_``, the
unquantized experts and the attention sinks), not through their weight loaders: vLLM's layer-wise reload puts meta
tensors in their place and waits for the loaders, so those copies are lost and the engine keeps its old weights (read
in vLLM 0.32 ``models/gpt_oss.py`` ``_load_weights_other``; the self-check's ``vllm_synced`` measured 2.6 nat)."""


def reload_by_copy(model: Any, device: str) -> tuple[str, ...]:
    """The :data:`RELOAD_BY_COPY` name parts of ``model`` (vLLM's model, inside its worker) on the CPU, whose packed
    expert layouts are redone after a reload (``vllm_cpu_fixes.repack_cpu_moe_experts``); empty elsewhere: off the
    CPU those layouts are the kernels' own, so only the layer-wise reload runs there, and the fail-closed sync check
    is what stops a stale engine."""
    return RELOAD_BY_COPY.get(type(model).__name__, ()) if device == "cpu" else ()


def reload_weights(worker: Any, weights: Iterator[tuple[str, torch.Tensor]], by_copy: tuple[str, ...] = ()) -> None:
    """Overwrite the worker's model weights in place from ``(Hugging Face name, full tensor)`` pairs (inside the
    worker), through vLLM's layer-wise reload; parameters left out keep their old values. vLLM 0.23, 0.32 and 0.33
    GPU/CPU workers: ``reload_weights(weights_iterator=...)``. vllm-ascend 0.23 (no ``reload_weights``):
    ``start_weight_update(is_checkpoint_format=True)``, ``update_weights`` through :func:`weight_transfer_kwargs`'
    backend, ``finish_weight_update()``. ``by_copy`` (:func:`reload_by_copy`): the weights whose names hold one of
    these parts are held back (copied: host memory for all of them) and loaded after the reload by the model's own
    ``load_weights``, into the live parameters as at the first load (the caller re-packs what the CPU kernels pack).
    Raises ``RuntimeError`` when the worker has neither API."""
    if by_copy:
        held: list[tuple[str, torch.Tensor]] = []

        def rest() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if any(part in name for part in by_copy):
                    held.append((name, tensor.clone()))  # a bucket's view: its buffer is reused
                else:
                    yield name, tensor

        reload_weights(worker, rest())
        worker.model_runner.get_model().load_weights(held)
        return
    if hasattr(worker, "reload_weights"):
        worker.reload_weights(weights_iterator=weights)
        return
    if not hasattr(worker, "start_weight_update") or getattr(worker, "weight_transfer_engine", None) is None:
        raise RuntimeError(
            f"vLLM {vllm_version()}'s {type(worker).__name__} has no reload_weights, and no weight-transfer engine for "
            "its start/update/finish_weight_update calls: easyrl supports vLLM 0.23, 0.32 and 0.33 "
            "(easyrl.workers.vllm_compat), with the engine built with vllm_compat.weight_transfer_kwargs()."
        )
    worker.start_weight_update(is_checkpoint_format=True)  # vLLM 0.23's signature
    worker.update_weights({"weights": weights})
    worker.finish_weight_update()


def wake_up(llm: Any, tags: Optional[list[str]]) -> None:
    """Re-allocate what ``LLM.sleep`` freed: ``tags`` among ``weights`` and ``kv_cache``, None for all
    (``LLM.wake_up(tags=tags)``, vLLM 0.23, 0.32 and 0.33). Where the weights woke, each worker then re-registers the
    fused-MoE weights that this ``wake_up`` turned into transposed views as their storage
    (:func:`untranspose_moe_weights`): by behaviour, not by version, as vllm-ascend 0.23.0.post1 and its release
    candidates up to at least ``releases/v0.26.0rc`` transpose them (docs/vllm-versions.md). Views from before the
    call (a kernel's own layout) are left as they are; elsewhere the check finds nothing (two ``collective_rpc``
    calls over the parameters' metadata)."""
    weights = tags is None or "weights" in tags
    before = sorted(set().union(*llm.collective_rpc(_worker_moe_views))) if weights else []
    llm.wake_up(tags=tags)
    if weights:
        llm.collective_rpc(_untranspose_worker_moe_weights, kwargs={"keep": before})


def moe_weight_views(model: torch.nn.Module) -> list[str]:
    """Names of the fused-MoE ``w13_weight`` / ``w2_weight`` parameters (3-D) that are transposed views of
    contiguous storage (their last two dimensions swapped)."""
    return [name for name, p in model.named_parameters() if name.endswith(("w13_weight", "w2_weight"))
            and p.dim() == 3 and not p.is_contiguous() and p.transpose(1, 2).is_contiguous()]


def untranspose_moe_weights(model: torch.nn.Module, keep: Collection[str] = ()) -> list[str]:
    """Re-register each of :func:`moe_weight_views` not in ``keep`` as its storage, in place; returns the names
    changed. vllm-ascend 0.23's ``NPUWorker.wake_up`` leaves such views, which the next reload fills wrongly
    (docs/vllm-versions.md)."""
    names = [name for name in moe_weight_views(model) if name not in keep]
    for name in names:
        parent, _, leaf = name.rpartition(".")
        module = model.get_submodule(parent)
        setattr(module, leaf, torch.nn.Parameter(getattr(module, leaf).transpose(1, 2), requires_grad=False))
    return names


def _worker_moe_views(worker: Any) -> list[str]:
    return moe_weight_views(worker.model_runner.get_model())


def _untranspose_worker_moe_weights(worker: Any, keep: Collection[str] = ()) -> list[str]:
    return untranspose_moe_weights(worker.model_runner.get_model(), keep)


def openai_serving_api() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """vLLM's OpenAI server pieces, for an app built without ``vllm serve`` (``easyrl.trainer.agent_endpoint``):
    ``(make_arg_parser, validate_parsed_serve_args, build_app, init_app_state)``, called alike on every line
    (``build_app(args, supported_tasks)``, ``await init_app_state(engine_client, app.state, args, supported_tasks)``).
    vLLM 0.23: ``vllm.entrypoints.openai.cli_args`` and ``vllm.entrypoints.openai.api_server``. vLLM 0.32 on:
    ``vllm.entrypoints.launchers`` (``cli_args``, ``app``, ``api_server.app_state``; the old module is a deprecated
    re-export that warns on import)."""
    version = vllm_version()
    if version is not None and version < (0, 32):
        from vllm.entrypoints.openai.api_server import build_app, init_app_state
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    else:
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    return make_arg_parser, validate_parsed_serve_args, build_app, init_app_state


def has_state_layers(architecture: str) -> bool:
    """Whether vLLM's class for ``architecture`` keeps a per-request state beside its KV cache (Mamba, Gated
    DeltaNet, short-convolution layers: ``_ModelInfo.has_inner_state`` or ``is_hybrid``, the latter for the VL
    classes of Qwen3.5; read from the registry without building the model; False for an architecture vLLM does not
    list). Such a model takes prefix caching only with chunked
    prefill (vLLM 0.32 ``MambaModelConfig``: "Chunked prefill is required for mamba cache mode 'align'")."""
    from vllm import ModelRegistry

    inspect = getattr(ModelRegistry, "_try_inspect_model_cls", None)
    info = inspect(architecture) if inspect is not None else None
    return bool(getattr(info, "has_inner_state", False) or getattr(info, "is_hybrid", False))


def keep_transformers_classes_callable() -> int:
    """vLLM's Transformers backend (the families its registry maps to ``TransformersForCausalLM``: OLMo 2, SmolLM3,
    Arcee, ...) decorates transformers' own decoder class in place with ``support_torch_compile`` (vLLM 0.32:
    ``TransformersBase._decorate_for_torch_compile``), whose ``__call__`` reads an instance attribute
    ``do_not_compile`` that only instances built after the decoration have: the colocated actor's model, built before
    the engine, then raises ``AttributeError`` in its next forward. Gives each decorated class the default
    ``do_not_compile = True`` (such an instance runs its plain ``forward``; vLLM's own keeps its attribute). Call it
    after the engine is built; returns the number of classes given the default."""
    from transformers import PreTrainedModel

    changed, seen, stack = 0, set(), [PreTrainedModel]
    while stack:
        for cls in stack.pop().__subclasses__():
            if cls in seen:
                continue
            seen.add(cls)
            stack.append(cls)
            call = cls.__dict__.get("__call__")
            names = getattr(getattr(call, "__code__", None), "co_names", ())
            if "do_not_compile" in names and "do_not_compile" not in cls.__dict__:
                cls.do_not_compile = True
                changed += 1
    return changed
