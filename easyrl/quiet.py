"""A readable console: library messages that say nothing to an easyrl user (``NOISE``, each with its reason) are
dropped and worker progress bars turned off. ``EASYRL_VERBOSE=1`` keeps everything; ``VLLM_LOGGING_LEVEL`` and
``EASYRL_LOG_LEVEL`` set the vLLM and easyrl levels (docs/metrics.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator

from easyrl import envvars

VERBOSE_ENV = envvars.VERBOSE

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
    ("vllm.v1.engine.input_processor", r"Passing raw prompts to InputProcessor is deprecated",
     "easyrl's request-level engine passes {prompt_token_ids, multi_modal_data} to LLMEngine.add_request, the one "
     "form vLLM 0.23 and 0.32 both take (easyrl.workers.request_engine)"),
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
    """Whether ``EASYRL_VERBOSE`` is on in this process (``easyrl.envvars.verbose``; raises ``EnvValueError`` for a
    value that is no switch)."""
    return envvars.verbose(os.environ)


class NoiseFilter(logging.Filter):
    """Drops the records of one logger whose message matches ``pattern`` (``re.match``: from the start)."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.match(record.getMessage()) is None


def worker_env() -> dict[str, str]:
    """Worker processes' environment: vLLM at WARNING unless ``VLLM_LOGGING_LEVEL`` is set, no progress bars, torch's
    C++ warnings from ERROR up."""
    if verbose():
        return {VERBOSE_ENV: "1", "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO")}
    return {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"), "TQDM_DISABLE": "1",
            "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}


def quiet_libraries() -> None:
    """Filter ``NOISE`` on its loggers (logger filters survive vLLM re-configuring its handlers) and ignore the
    ``WARNINGS`` in this process; idempotent, nothing with ``EASYRL_VERBOSE``."""
    if verbose():
        return
    for name, pattern, _ in NOISE:
        target = logging.getLogger(name)
        if not any(isinstance(f, NoiseFilter) and f.pattern.pattern == pattern for f in target.filters):
            target.addFilter(NoiseFilter(pattern))
    for pattern, category in WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)


@contextlib.contextmanager
def root_levels_kept() -> Iterator[None]:
    """Inside, a library may set the root logger's level and its handlers' levels; on leaving they are what they
    were. vLLM's OpenAI app imports ``model_hosting_container_standards`` for its SageMaker routes (``build_app`` on
    vLLM 0.32, the ``api_server`` module on 0.23), which sets them to ERROR (its ``SAGEMAKER_CONTAINER_LOG_LEVEL``
    default): the calling process's warnings would go."""
    root = logging.getLogger()
    level, handlers = root.level, [(handler, handler.level) for handler in root.handlers]
    try:
        yield
    finally:
        root.setLevel(level)
        for handler, handler_level in handlers:
            handler.setLevel(handler_level)


def setup_command_logging() -> None:
    """A command's logging: ``EASYRL_LOG_LEVEL`` (default INFO, any case) with timestamps, and
    :func:`quiet_libraries`. Raises ``EnvValueError`` for a level or ``EASYRL_VERBOSE`` easyrl cannot read (call it
    inside ``easyrl.errors.run_cli``: one line)."""
    logging.basicConfig(level=envvars.log_level(os.environ), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries()
