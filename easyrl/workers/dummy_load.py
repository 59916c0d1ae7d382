"""``load_format`` of the colocated vLLM engine: random weights instead of the checkpoint, where the first sync provably
restores everything the engine computes with (docs/vllm-versions.md, "Start-up weights"): the sync writes every
parameter; ``easyrl_dummy`` (:func:`register_dummy_loader`) restores the persistent buffers vLLM's dummy loader
randomises; on the CPU ``vllm_cpu_fixes.repack_cpu_embedding_heads`` re-packs a tied ``lm_head``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Optional

import torch

DUMMY_LOAD_FORMAT = "easyrl_dummy"  # vLLM's dummy loader, persistent buffers kept (register_dummy_loader)

# the vLLM lines whose dummy loader and layer-wise reload were read (docs/vllm-versions.md); 0.24-0.31 were not
READ = frozenset({(0, 23), (0, 32), (0, 33)})
# the vLLM-CPU lines where the e2e vLLM/actor parity passed with easyrl_dummy; other CPU lines read the checkpoint
CPU_SHOWN = frozenset({(0, 32)})


def load_format(device: str, vllm_version: Optional[tuple[int, int]]) -> Optional[str]:
    """The colocated engine's ``load_format`` (a pure function of the engine's backend ``device`` and vLLM's
    ``(major, minor)``, or None): :data:`DUMMY_LOAD_FORMAT` where the first sync provably restores everything
    (parameters overwritten by the sync, ``check_all_loaded``; persistent buffers kept from construction; on the CPU
    packed embedding heads re-packed after every sync, ``vllm_cpu_fixes.repack_cpu_embedding_heads``): a line of
    :data:`READ`, on the CPU one of :data:`CPU_SHOWN`. Else None: the engine reads the checkpoint."""
    shown = CPU_SHOWN if device == "cpu" else READ
    return DUMMY_LOAD_FORMAT if vllm_version is not None and vllm_version[:2] in shown else None


def keep_persistent_buffers(model: torch.nn.Module) -> Callable[[], int]:
    """Snapshot every persistent buffer of ``model`` (what vLLM's dummy loader randomises beside the parameters;
    non-persistent ones it leaves alone); the returned function copies them back in place and returns how many."""
    kept = [(buffer, buffer.detach().clone())
            for module in model.modules()
            for name, buffer in module._buffers.items()
            if buffer is not None and name not in module._non_persistent_buffers_set and not buffer.is_meta]

    @torch.no_grad()
    def restore() -> int:
        for buffer, value in kept:
            buffer.copy_(value)
        return len(kept)

    return restore


@functools.cache
def register_dummy_loader() -> type:
    """Register (once per process, before ``LLM(...)``) and return the ``easyrl_dummy`` model loader: vLLM's
    ``DummyModelLoader`` with the persistent buffers kept (same API on every line of :data:`READ`).
    """
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    class BufferKeepingDummyLoader(DummyModelLoader):
        """vLLM's dummy loader, persistent buffers put back to their constructor values (easyrl.workers.dummy_load)."""

        def load_weights(self, model: torch.nn.Module, model_config) -> None:
            restore = keep_persistent_buffers(model)
            super().load_weights(model, model_config)
            restore()

    return register_model_loader(DUMMY_LOAD_FORMAT)(BufferKeepingDummyLoader)
