"""The one place for what differs between vLLM release lines (0.23, 0.32 and 0.33: the lines read; 0.24 to 0.31
were not): every call into vLLM whose name, arguments or location has changed across lines goes through a small
function here, whose docstring names the lines it serves; a line-specific branch tests :func:`vllm_version` or the
engine's own API, so dropping a line is deleting its branches. The calls checked to be the same on every line read are
made directly (the list, and how the lines are tested: docs/vllm-versions.md); CPU-backend workarounds live in
``easyrl.workers.vllm_cpu_fixes``. Nothing here imports vLLM at module level: the driver imports this module without
vLLM being usable there.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
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


def in_process_engine_env() -> dict[str, str]:
    """Environment variables that make ``vllm.LLM`` run its engine core in the calling process (so that weights are
    handed over as tensors, never through disk or IPC) and let it take new weights; set before vLLM is imported.

    vLLM 0.23, 0.32 and 0.33: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``. (vllm-ascend 0.23 also needs
    ``VLLM_ASCEND_ENABLE_NZ=0``: its default, 1, stores weights in the FRACTAL_NZ layout, and its ``wake_up`` and
    ``start_weight_update`` then refuse to run; NPU workers get it from ``easyrl.workers.group.worker_runtime_env``.)
    """
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def sampled_logprobs_kwargs() -> dict[str, Any]:
    """``vllm.LLM`` arguments under which a sampled token's log-prob is the one of the distribution actually sampled
    from (after temperature, top-k and top-p), which is what the actor recomputes (logits / temperature) for the
    rollout/training mismatch.

    vLLM 0.23, 0.32 and 0.33: ``logprobs_mode="processed_logprobs"`` (the default, ``raw_logprobs``, is before
    temperature).
    """
    return {"logprobs_mode": "processed_logprobs"}


IN_PROCESS_TRANSFER = "easyrl_in_process"  # the weight-transfer backend registered by ``weight_transfer_kwargs``


def weight_transfer_kwargs() -> dict[str, Any]:
    """``vllm.LLM`` arguments that let :func:`reload_weights` use vLLM's native weight-update calls where the worker has
    no ``reload_weights``; call it in the process that builds the engine, before ``LLM(...)``.

    vLLM 0.23: registers the in-process backend (:func:`in_process_transfer_engine`) with vLLM's
    ``WeightTransferEngineFactory`` and returns ``weight_transfer_config={"backend": "easyrl_in_process"}``: the native
    calls of vllm-ascend 0.23's ``NPUWorker`` refuse to run without a weight-transfer engine, and the built-in ones
    move tensors between processes. vLLM 0.32: nothing (every worker of the line has ``reload_weights``).
    """
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
    iterator})`` hands the ``(Hugging Face name, full tensor)`` pairs to the loader vLLM passes (the model's
    ``load_weights`` inside the layer-wise reload that ``start_weight_update`` / ``finish_weight_update`` frame), by
    reference, with no transport. The class is built on first use (vLLM is imported then)."""
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


def run_on_workers(llm: Any, fn: Callable[..., Any], **kwargs: Any) -> list[Any]:
    """``fn(worker, **kwargs)`` inside each of the engine's workers (one for an in-process engine), results in worker
    order.

    vLLM 0.23, 0.32 and 0.33: ``LLM.collective_rpc(fn, kwargs=kwargs)``.
    """
    return llm.collective_rpc(fn, kwargs=kwargs)


def worker_model(worker: Any) -> torch.nn.Module:
    """The model a vLLM worker runs (called inside the worker, e.g. by :func:`run_on_workers`).

    vLLM 0.23, 0.32 and 0.33 (and vllm-ascend 0.23's ``NPUWorker``): ``worker.model_runner.get_model()``.
    """
    return worker.model_runner.get_model()


def reload_weights(worker: Any, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Overwrite the worker's model weights in place from ``(Hugging Face name, full tensor)`` pairs (called inside
    the worker): checkpoint names mapped, weights post-processed and the worker's caches reset as on a load, no
    re-initialisation. Parameters left out keep their old values (vLLM only warns). Both branches run vLLM's
    layer-wise reload around the model's ``load_weights`` (a layer must come whole in one call).

    vLLM 0.23, 0.32 and 0.33, GPU and CPU workers: the worker's public ``reload_weights(weights_iterator=...)``.
    vllm-ascend 0.23 (``NPUWorker``, no ``reload_weights``): vLLM 0.23's native calls,
    ``start_weight_update(is_checkpoint_format=True)``, ``update_weights({"weights": weights})`` through the
    in-process backend of :func:`weight_transfer_kwargs`, ``finish_weight_update()`` (it raises unless
    ``VLLM_ASCEND_ENABLE_NZ=0``).

    Raises:
        RuntimeError: the worker has neither API (another vLLM line, or an engine built without
            :func:`weight_transfer_kwargs`).
    """
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


def reset_caches_after_reload(llm: Any) -> None:
    """Drop every cache computed with the old weights, after :func:`reload_weights`.

    vLLM 0.23, 0.32 and 0.33: ``reload_weights`` clears the worker's encoder cache but not the scheduler's record of
    it, which otherwise ends in "Encoder cache miss" on the next image prompt: ``llm.llm_engine.reset_encoder_cache()``
    (the native calls of vllm-ascend 0.23 clear neither; this clears both), then ``LLM.reset_mm_cache()`` (the
    processor's multi-modal cache) and ``LLM.reset_prefix_cache()``.
    """
    llm.llm_engine.reset_encoder_cache()
    llm.reset_mm_cache()
    llm.reset_prefix_cache()


def sleep(llm: Any, level: int) -> None:
    """Free the engine's device memory: level 1 the KV cache (weights kept in host memory), level 2 the weights too.

    vLLM 0.23, 0.32 and 0.33: ``LLM.sleep(level=level)`` (needs ``enable_sleep_mode=True`` at start; not on the CPU
    backend).
    """
    llm.sleep(level=level)


def wake_up(llm: Any, tags: Optional[list[str]]) -> None:
    """Re-allocate what :func:`sleep` freed: ``tags`` among ``weights`` and ``kv_cache``, None for all.

    vLLM 0.23, 0.32 and 0.33: ``LLM.wake_up(tags=tags)`` (vllm-ascend 0.23 refuses it while its FRACTAL_NZ weight
    mode is on). vLLM 0.23 (vllm-ascend 0.23): then :func:`untranspose_moe_weights` in each worker.
    """
    llm.wake_up(tags=tags)
    if (tags is None or "weights" in tags) and (vllm_version() or (0, 24)) < (0, 24):
        run_on_workers(llm, _untranspose_worker_moe_weights)


def untranspose_moe_weights(model: torch.nn.Module) -> list[str]:
    """Re-register each fused-MoE ``w13_weight`` / ``w2_weight`` that is a transposed view of contiguous storage as
    that storage, ``Parameter(p.transpose(1, 2))``: the layout ``process_weights_after_loading`` left, which the
    forward and vLLM's layer-wise reload expect. In place; returns the names changed (none where nothing is
    transposed).

    vllm-ascend 0.23 (through at least 0.25.1rc1; removed by #13012 on its main): ``NPUWorker.wake_up`` with the
    ``weights`` tag replaces both tensors of every unquantized MoE layer by such views, (E, 2I, H) and (E, H, I). The
    layer-wise reload of the next weight sync then copies the reprocessed (E, H, 2I) into the (E, 2I, H) view: a size
    error, or, where 2I == H, experts silently run transposed (vllm-ascend #5915, #11548).
    """
    names = [name for name, p in model.named_parameters() if name.endswith(("w13_weight", "w2_weight"))
             and p.dim() == 3 and not p.is_contiguous() and p.transpose(1, 2).is_contiguous()]
    for name in names:
        parent, _, leaf = name.rpartition(".")
        module = model.get_submodule(parent)
        setattr(module, leaf, torch.nn.Parameter(getattr(module, leaf).transpose(1, 2), requires_grad=False))
    return names


def _untranspose_worker_moe_weights(worker: Any) -> list[str]:
    return untranspose_moe_weights(worker_model(worker))


def destroy_model_parallel() -> None:
    """Tear down the tensor-parallel groups of this process's engine (their owners unlink their shared-memory
    segments, e.g. the 24 MiB broadcast ring of each group).

    vLLM 0.23, 0.32 and 0.33: ``vllm.distributed.parallel_state.destroy_model_parallel()``.
    """
    from vllm.distributed.parallel_state import destroy_model_parallel as destroy

    destroy()
