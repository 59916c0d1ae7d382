"""Start-up and stop on the driver, for training and ``easyrl eval``: Ray (after every pre-flight check), the start-up
profile, and stopping a run cleanly on SIGTERM / SIGINT (a scheduler's preemption, Ctrl-C): the first signal only sets
a flag, the trainer finishes the step it is in, saves a checkpoint and returns (the command then exits with
``128 + signal``, e.g. 143 for SIGTERM, so schedulers see it did not finish); a second signal exits at once with the
same status, without saving."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Optional

from easyrl.quiet import verbose

logger = logging.getLogger("easyrl")
_stop_logger = logging.getLogger("easyrl.trainer")

# the phases of the console line, in the order they happen (a phase the run does not have is left out)
STARTUP_PHASES = ("launch", "preflight", "ray", "workers", "imports", "process_group", "actor", "ref", "critic",
                  "reward_model", "teacher", "vllm_import", "engine", "validation", "other", "first_sync")


class StartupProfile:
    """Wall-clock seconds of each start-up phase (:data:`STARTUP_PHASES`, docs/metrics.md) from ``start``
    (``time.time()``; None: this process's start) to step 1, reported once as ``timing_s/startup/<phase>`` and one
    console line ``startup 41.2 s: launch 3.1, ...``."""

    def __init__(self, start: Optional[float] = None):
        if start is None:
            import psutil

            start = psutil.Process().create_time()
        self.start = start
        self.seconds: dict[str, float] = {}
        self.reported = False

    def add(self, phase: str, seconds: float) -> None:
        """Add ``seconds`` to ``phase``."""
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def report(self, step_metrics: dict[str, float]) -> dict[str, float]:
        """The ``timing_s/startup/*`` metrics after step 1 (``step_metrics``: its ``timing_s/step`` and
        ``timing_s/reshard``), with the console line logged; an empty dict on any later call."""
        if self.reported:
            return {}
        self.reported = True
        seconds = dict(self.seconds)
        if "timing_s/reshard" in step_metrics:
            seconds["first_sync"] = step_metrics["timing_s/reshard"]
        total = time.time() - self.start - step_metrics.get("timing_s/step", 0.0)
        # the rest: the trainer's own set-up (data loader, rollout, validator, tracker), a resumed checkpoint's load
        seconds["other"] = total - sum(value for name, value in seconds.items() if name not in ("imports", "first_sync"))
        parts = [f"{name} {seconds[name]:.1f}" for name in STARTUP_PHASES if name in seconds and name != "imports"]
        if "imports" in seconds:  # inside "workers"
            parts = [f"{part} (imports {seconds['imports']:.1f})" if part.startswith("workers ") else part
                     for part in parts]
        logger.info("startup %.1f s: %s", total, ", ".join(parts))
        return {f"timing_s/startup/{name}": value for name, value in {**seconds, "total": total}.items()}


def quiet_datasets() -> None:
    """Hide the ``datasets`` library's progress bars ("Casting the dataset", at every load) unless verbose."""
    if not verbose():
        import datasets

        datasets.disable_progress_bars()


def start_ray(config) -> str:
    """Start Ray unless started (without a dashboard: ``ray start --head`` first for one, docs/multinode.md);
    returns the workers' device kind, ``cuda``, ``npu`` or ``cpu`` (``trainer.device=auto``: what Ray offers)."""
    import ray

    from easyrl.device import detect_device

    if not ray.is_initialized():
        ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}, include_dashboard=False,
                 logging_level=logging.INFO if verbose() else logging.WARNING)
    device = config.trainer.device
    if device == "auto":
        device = detect_device(ray.cluster_resources())
    return device


SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """Installs the handlers inside (main thread only) and restores the previous ones; ``signum``: the first signal
    received, or None."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self.signum is not None

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            _stop_logger.error("second %s: exiting now without saving", name)
            os._exit(128 + signum)
        self.signum = signum
        _stop_logger.warning("%s received: finishing this step, saving a checkpoint, then stopping (send it again to "
                       "exit at once)", name)

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
