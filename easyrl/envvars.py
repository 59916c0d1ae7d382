"""The environment variables easyrl reads and interprets, each read by one pure function here (its one reader), and
:func:`check_environment`, the pre-flight that reads them all, in this process's environment and in
``worker.env_vars``, before Ray starts (``easyrl.trainer.preflight.prepare``; table: docs/environment.md).

A bad value is an :class:`EnvValueError` naming the variable, its value, where it was set, what is accepted and what
to do (docs/errors.md, E01-E07). Switches accept ``1/0/true/false/yes/no/on/off`` in any case; empty means unset.
This module imports nothing of easyrl: the core modules (``easyrl.errors``, ``easyrl.quiet``) read their switches
here too, and ``easyrl.errors.run_cli`` prints an ``EnvValueError`` as one line like any user error.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Callable, Optional

DEBUG = "EASYRL_DEBUG"
VERBOSE = "EASYRL_VERBOSE"
LOG_LEVEL = "EASYRL_LOG_LEVEL"
PEAK_TFLOPS = "EASYRL_PEAK_TFLOPS"
CHECK_COLLECTIVES = "EASYRL_CHECK_COLLECTIVES"
OMP_THREADS = "OMP_NUM_THREADS"
CPU_KVCACHE = "VLLM_CPU_KVCACHE_SPACE"
ROOTINFO_SUBCOMM = "ROOTINFO_SUBCOMM_ENABLE"
CACHE = "EASYRL_CACHE"

ENVIRONMENT = "the environment"
ENV_VARS = "worker.env_vars"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
SWITCH = "a switch (1, true, yes, on / 0, false, no, off, in any case)"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

logger = logging.getLogger("easyrl")


class EnvValueError(ValueError):
    """An environment variable (or ``worker.env_vars`` entry) with a value easyrl cannot read; ``kind`` ``env`` is the
    word after ``easyrl:`` (``easyrl.errors.run_cli`` prints it as one line, as a ``UserError``)."""

    kind = "env"

    def __init__(self, name: str, value: str, source: str, accepted: str, fix: str):
        self.message = f"{name}={value!r} is not {accepted}, in {source}; {fix}."
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


def _given(environ: Mapping[str, str], name: str) -> Optional[str]:
    """``name``'s value in ``environ``, stripped; None when unset or empty."""
    value = environ.get(name)
    return value.strip() if value is not None and value.strip() else None


def parse_switch(name: str, value: Optional[str], source: str = ENVIRONMENT) -> bool:
    """A switch's value: True for ``1/true/yes/on``, False for ``0/false/no/off`` (any case) and for None or empty.

    Raises:
        EnvValueError: any other value (``name`` and ``source`` name it)."""
    word = (value or "").strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS or not word:
        return False
    raise EnvValueError(name, value or "", source, SWITCH, f"write {name}=1 to turn it on or {name}=0 (or unset it) "
                        "to turn it off")


def parse_number(name: str, value: Optional[str], source: str, kind: Callable[[str], float], least: float,
                 what: str) -> Optional[float]:
    """``value`` read by ``kind`` (``int``: a whole number at least ``least``; ``float``: a finite number above
    ``least``); None when None or empty. ``what`` says what the number is, with its unit, for the message.

    Raises:
        EnvValueError: not such a number (``name`` and ``source`` name it)."""
    if value is None or not value.strip():
        return None
    try:
        number: Optional[float] = kind(value.strip())
    except ValueError:
        number = None
    whole = kind is int
    if number is None or not abs(number) < float("inf") or (number < least if whole else number <= least):
        accepted = f"a whole number >= {least:g}" if whole else f"a number > {least:g}"
        raise EnvValueError(name, value, source, f"{accepted} ({what})", f"write e.g. {name}={max(1, int(least))}, "
                            "or unset it")
    return number


def debug(environ: Mapping[str, str]) -> bool:
    """``EASYRL_DEBUG``: user errors re-raised with their traceback. Raises ``EnvValueError`` (see parse_switch)."""
    return parse_switch(DEBUG, environ.get(DEBUG))


def verbose(environ: Mapping[str, str], source: str = ENVIRONMENT) -> bool:
    """``EASYRL_VERBOSE``: every library message and progress bar kept (``easyrl.quiet``). Raises
    ``EnvValueError``."""
    return parse_switch(VERBOSE, environ.get(VERBOSE), source)


def log_level(environ: Mapping[str, str]) -> str:
    """``EASYRL_LOG_LEVEL``: the commands' log level name in upper case (default ``INFO``; any case accepted).

    Raises:
        EnvValueError: not one of DEBUG, INFO, WARNING, ERROR, CRITICAL."""
    given = _given(environ, LOG_LEVEL)
    if given is None:
        return "INFO"
    if given.upper() not in LOG_LEVELS:
        raise EnvValueError(LOG_LEVEL, environ[LOG_LEVEL], ENVIRONMENT, f"a log level ({', '.join(LOG_LEVELS[:4])})",
                            f"write e.g. {LOG_LEVEL}=DEBUG")
    return given.upper()


def peak_tflops(environ: Mapping[str, str]) -> Optional[float]:
    """``EASYRL_PEAK_TFLOPS``: one device's peak in TFLOP/s for MFU, over the device table; None when unset.
    Raises ``EnvValueError`` for a value that is not a positive number."""
    return parse_number(PEAK_TFLOPS, environ.get(PEAK_TFLOPS), ENVIRONMENT, float, 0,
                        "one device's dense peak in TFLOP/s")


def check_collectives(environ: Mapping[str, str], source: str = ENVIRONMENT) -> bool:
    """``EASYRL_CHECK_COLLECTIVES``: the collective contract on, as ``trainer.check_collectives=true``
    (``easyrl.workers.collectives``). Raises ``EnvValueError``."""
    return parse_switch(CHECK_COLLECTIVES, environ.get(CHECK_COLLECTIVES), source)


def omp_threads(environ: Mapping[str, str], source: str = ENVIRONMENT) -> Optional[int]:
    """``OMP_NUM_THREADS``: a worker's intra-op threads (``torch.set_num_threads``); None when unset. Raises
    ``EnvValueError`` for a value that is not a positive whole number."""
    value = parse_number(OMP_THREADS, environ.get(OMP_THREADS), source, int, 1, "threads per worker process")
    return None if value is None else int(value)


def cpu_kvcache_gib(environ: Mapping[str, str], source: str = ENVIRONMENT) -> Optional[int]:
    """``VLLM_CPU_KVCACHE_SPACE``: the CPU backend's KV cache of one engine in GiB (vLLM reads it with ``int``; 0 is
    vLLM's default), over ``worker.rollout.cpu_kvcache_space_gib``; None when unset. Raises ``EnvValueError``."""
    value = parse_number(CPU_KVCACHE, environ.get(CPU_KVCACHE), source, int, 0, "GiB of KV cache per vLLM engine")
    return None if value is None else int(value)


def cache_dir(environ: Mapping[str, str]) -> str:
    """``EASYRL_CACHE`` (default ``~/.cache/easyrl``): where easyrl keeps what it builds (tiny models, converted
    checkpoints, self-check verdicts)."""
    import os

    return _given(environ, CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "easyrl")


def rootinfo_subcomm(environ: Mapping[str, str]) -> bool:
    """``ROOTINFO_SUBCOMM_ENABLE`` as torch_npu reads it (``OptionsManager::GetBoolTypeOption``: ``strtol``, non-zero
    is on, so ``true`` is off); never raises: every value means something to torch_npu."""
    number = re.match(r"\s*[+-]?\d+", environ.get(ROOTINFO_SUBCOMM) or "")
    return bool(number and int(number.group()))


READERS: dict[str, tuple[Callable[..., Any], bool, bool]] = {
    DEBUG: (debug, True, False), LOG_LEVEL: (log_level, True, False), PEAK_TFLOPS: (peak_tflops, True, False),
    VERBOSE: (verbose, True, True), CHECK_COLLECTIVES: (check_collectives, True, True),
    OMP_THREADS: (omp_threads, False, True), CPU_KVCACHE: (cpu_kvcache_gib, True, True),
    ROOTINFO_SUBCOMM: (rootinfo_subcomm, False, False),
}
"""Each interpreted variable: its reader, whether the pre-flight reads this process's value, and whether it reads the
``worker.env_vars`` value. ``OMP_NUM_THREADS`` only there (easyrl sets the workers' own; the command's may be an
OpenMP list), ``ROOTINFO_SUBCOMM_ENABLE`` nowhere (every value means something to torch_npu).
``tests/test_envvars.py`` checks that no other module of easyrl reads these names."""


def overrides(config: Any, environ: Mapping[str, str]) -> list[str]:
    """One line per variable that overrides a value of the finalized ``PPOConfig`` ``config`` (or the device table),
    read from ``environ`` and ``config.worker.env_vars``; all values already valid (:func:`check_environment`)."""
    env_vars, lines = config.worker.env_vars, []
    if not config.trainer.check_collectives:
        for source, mapping in ((ENVIRONMENT, environ), (ENV_VARS, env_vars)):
            if check_collectives(mapping, source):
                lines.append(f"{CHECK_COLLECTIVES}={mapping[CHECK_COLLECTIVES]!r} ({source}) overrides "
                             "trainer.check_collectives=false: the collective contract is on")
    if omp_threads(env_vars, ENV_VARS) is not None:
        lines.append(f"{OMP_THREADS}={env_vars[OMP_THREADS]!r} ({ENV_VARS}) overrides the threads easyrl gives each "
                     f"worker (trainer.cpu_threads_per_worker={config.trainer.cpu_threads_per_worker} on the CPU)")
    if config.trainer.device not in ("cuda", "npu"):
        source, mapping = (ENV_VARS, env_vars) if CPU_KVCACHE in env_vars else (ENVIRONMENT, environ)
        if cpu_kvcache_gib(mapping, source) is not None:
            lines.append(f"{CPU_KVCACHE}={mapping[CPU_KVCACHE]!r} ({source}) overrides worker.rollout."
                         f"cpu_kvcache_space_gib={config.worker.rollout.cpu_kvcache_space_gib:g} on the CPU backend")
    if peak_tflops(environ) is not None:
        lines.append(f"{PEAK_TFLOPS}={environ[PEAK_TFLOPS]!r} ({ENVIRONMENT}) overrides the device table's peak: "
                     "MFU is computed from it")
    return lines


def check_environment(config: Any, environ: Mapping[str, str]) -> list[str]:
    """The pre-flight: every variable of :data:`READERS` read from ``environ`` (this process's environment) and from
    ``config.worker.env_vars`` as the table says, then one INFO line per override (:func:`overrides`), which it
    returns. Raises ``EnvValueError`` for the first bad value."""
    for name, (reader, in_environment, in_env_vars) in READERS.items():
        if in_environment:
            reader(environ)
        if in_env_vars and name in config.worker.env_vars:
            reader(config.worker.env_vars, ENV_VARS)
    lines = overrides(config, environ)
    for line in lines:
        logger.info("%s", line)
    return lines


@contextlib.contextmanager
def replaced(environ: MutableMapping[str, str], name: str, value: Optional[str]) -> Iterator[None]:
    """Inside: ``environ[name]`` is ``value`` (None: unset); on leaving, what it was (unset if it was)."""
    saved = environ.pop(name, None)
    if value is not None:
        environ[name] = value
    try:
        yield
    finally:
        environ.pop(name, None)
        if saved is not None:
            environ[name] = saved
