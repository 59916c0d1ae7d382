"""A readable console: library messages that say nothing to an easyrl user are dropped, every other one is kept.

What is dropped (by default; ``EASYRL_VERBOSE=1`` keeps everything) is listed in ``NOISE`` with the reason: vLLM's
start-up notes about settings easyrl chose on purpose (eager mode, chunked prefill off, in-process engine, the seed),
CPU-backend performance hints (tcmalloc/iomp preload, Triton CPU, thread binding), the "Failed to load weights"
notes about layers that have no weights when weights are reloaded in place (rotary embeddings, fused norms: real
layers that fail still warn), vLLM's line per weight of a float32 checkpoint cast to a 16-bit engine dtype, and
deprecation notices raised inside vLLM/transformers.
Progress bars of worker processes (weight loading) are turned off with ``TQDM_DISABLE=1``.

Switches, for when the full logs are wanted:

- ``EASYRL_VERBOSE=1``: no filtering at all, vLLM at INFO, worker progress bars and torch's C++ warnings back on.
- ``VLLM_LOGGING_LEVEL=INFO|DEBUG`` (vLLM's own variable; default WARNING in the workers).
- ``EASYRL_LOG_LEVEL=DEBUG`` (the easyrl loggers of the driver process; default INFO).
- ``RAY_DEDUP_LOGS=0`` (Ray's: print repeated worker lines again instead of "[repeated Nx across cluster]").
"""

from __future__ import annotations

import logging
import os
import re
import warnings

VERBOSE_ENV = "EASYRL_VERBOSE"

# (logger name, message pattern matched from the start, why it is noise)
NOISE: tuple[tuple[str, str, str], ...] = (
    ("vllm.engine.arg_utils", r"The global random seed is set to", "easyrl seeds each engine on purpose"),
    ("vllm.engine.arg_utils", r"This model does not officially support disabling chunked prefill",
     "chunked prefill off is the rollout's configured choice"),
    ("vllm.config.vllm", r"(Enforce eager set|Inductor compilation was disabled|Model Runner V2 requires Triton)",
     "consequences of worker.rollout.enforce_eager / the CPU backend"),
    ("vllm.platforms.cpu", r"(Triton is not installed|Reset SSM cache type)", "CPU backend notes"),
    ("vllm.triton_utils.importing", r"Triton is installed, but doesn't include CPU backend", "CPU backend note"),
    ("vllm.v1.worker.cpu_worker", r"(\S+ is not found in LD_PRELOAD|CPU backend doesn't allow to use `torch\.set_num"
     r"_threads`|sleep mode is not supported on CPU)", "CPU performance hints; easyrl sets the threads itself"),
    ("vllm.model_executor.model_loader.reload.layerwise",
     r"(\w*RotaryEmbedding|FusedMMInputNorm): Failed to load weights",
     "these layers hold no checkpoint weights (rotary caches, fused norms); an in-place reload has none to give"),
    ("vllm.model_executor.models.utils", r"Attempted to load weight \S+ with dtype torch\.float32 into parameter with "
     r"dtype torch\.(bfloat16|float16)", "one line per weight of a float32 checkpoint served in the engine's 16-bit "
     "dtype (worker.reward.judge.dtype, worker.rollout.dtype), the cast those keys ask for"),
    ("torch.utils.cpp_extension", r"No CUDA runtime is found", "torch's note on a CPU-only host"),
    ("vllm.envs", r"Unknown vLLM environment variable detected: VLLM_ASCEND_ENABLE_NZ",
     "vLLM 0.23 without vllm-ascend does not know the NZ switch that easyrl sets for NPUs (vllm_compat)"),
    ("ray._private.authentication.authentication_token_setup", r"(Token authentication is enabled|Generated new "
     r"authentication token)", "a local Ray cluster's own token; nothing to do"),
)

# Python warnings raised inside libraries (message pattern, category)
WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    (r"`torch\.distributed\.reduce_op` is deprecated", FutureWarning),  # vLLM's triton dispatcher scans torch
    (r"Passing `min_pixels` and `max_pixels` to a processor call is deprecated", FutureWarning),  # vLLM -> HF call
    (r"'set_vital' is deprecated", UserWarning),  # torchdata's StatefulDataLoader calls it on every iterator
)


def verbose() -> bool:
    """Whether the user asked for the full library logs (``EASYRL_VERBOSE`` set to anything but 0/false/empty)."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class NoiseFilter(logging.Filter):
    """Drops the records of one logger whose message matches ``pattern`` (``re.match``: from the start)."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.match(record.getMessage()) is None


def worker_env() -> dict[str, str]:
    """Environment variables for worker processes (set before torch/vLLM are imported there): vLLM at WARNING
    (``VLLM_LOGGING_LEVEL`` wins if set), no progress bars, torch's C++ warnings only from ERROR up."""
    if verbose():
        return {VERBOSE_ENV: "1", "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO")}
    return {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"), "TQDM_DISABLE": "1",
            "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}


def quiet_libraries() -> None:
    """Install the ``NOISE`` filters on their loggers and ignore the ``WARNINGS`` in this process (idempotent).

    Logger filters (not handler filters) survive vLLM re-configuring its handlers when an engine starts, and need
    no library imported first. Does nothing when ``EASYRL_VERBOSE`` is set.
    """
    if verbose():
        return
    for name, pattern, _ in NOISE:
        target = logging.getLogger(name)
        if not any(isinstance(f, NoiseFilter) and f.pattern.pattern == pattern for f in target.filters):
            target.addFilter(NoiseFilter(pattern))
    for pattern, category in WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)


def setup_command_logging() -> None:
    """The logging of a command (``easyrl train``, ``easyrl eval``): ``EASYRL_LOG_LEVEL`` (default INFO, any case; an
    unknown name is warned of and INFO used) with timestamps, and the library-noise filters (:func:`quiet_libraries`)."""
    given = os.environ.get("EASYRL_LOG_LEVEL", "INFO")
    known = given.strip().upper() in logging.getLevelNamesMapping()
    logging.basicConfig(level=given.strip().upper() if known else "INFO",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not known:
        logging.getLogger("easyrl").warning("EASYRL_LOG_LEVEL=%r is not a log level (DEBUG, INFO, WARNING, ERROR): "
                                            "INFO is used", given)
    quiet_libraries()
