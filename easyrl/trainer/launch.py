"""Start-up on the driver, shared by training (``build_trainer``) and evaluation (``easyrl.trainer.evaluation``): Ray,
started after every pre-flight check so that a user error never waits for it, and the start-up profile."""

from __future__ import annotations

import logging
import time
from typing import Optional

from easyrl.quiet import verbose

logger = logging.getLogger("easyrl")

# the phases of the console line, in the order they happen (a phase the run does not have is left out)
STARTUP_PHASES = ("launch", "preflight", "ray", "workers", "imports", "process_group", "actor", "ref", "critic",
                  "reward_model", "teacher", "vllm_import", "engine", "validation", "other", "first_sync")


class StartupProfile:
    """Wall-clock seconds of each start-up phase, from the command's start to the first training step, reported once
    as ``timing_s/startup/<phase>`` in the first metrics row and as one console line::

        startup 41.2 s: launch 3.1, preflight 2.0, ray 6.3, workers 12.3 (imports 9.8), ... first_sync 0.4

    Phases: ``launch`` (interpreter start, imports, config), ``preflight`` (tokenizer/processor, datasets, reward
    check), ``ray`` (``ray.init``), ``workers`` (placement group and worker processes until every one answers; of
    it ``imports``: a worker's process start to its ``__init__``, mostly importing torch/transformers), ``process_group``,
    per model role ``actor`` / ``ref`` / ``critic`` / ``reward_model`` / ``teacher`` (FSDP2 build and load, slowest rank),
    ``vllm_import`` and ``engine`` (the vLLM engine's build: model, profiling, KV cache; slowest rank), ``validation``
    (before training), ``other`` (the rest: the trainer's own set-up, a resumed checkpoint), ``first_sync`` (step 1's
    weight sync, inside step 1). ``total`` runs from ``start`` to the beginning of step 1 (the first sync excluded).

    Args:
        start: the start, ``time.time()`` seconds; None: this process's start (the command's).
    """

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
    """Start Ray (unless already started) and resolve ``trainer.device``. A Ray started here runs no dashboard (its
    ten processes cost seconds of start-up on a small machine); for one, start the cluster with ``ray start --head``
    first: the trainer attaches to it (docs/multinode.md).

    Args:
        config: the finalized ``PPOConfig``.

    Returns:
        The device kind the workers use: ``cuda``, ``npu`` or ``cpu`` (``auto``: what Ray's cluster offers).
    """
    import ray

    from easyrl.device import detect_device

    if not ray.is_initialized():
        ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}, include_dashboard=False,
                 logging_level=logging.INFO if verbose() else logging.WARNING)
    device = config.trainer.device
    if device == "auto":
        device = detect_device(ray.cluster_resources())
    return device
