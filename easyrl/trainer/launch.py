"""Starting Ray on the driver, shared by training (``build_trainer``) and evaluation (``easyrl.trainer.evaluation``):
called after every pre-flight check, so that a user error never waits for Ray."""

from __future__ import annotations

import logging

from easyrl.quiet import verbose


def quiet_datasets() -> None:
    """Hide the ``datasets`` library's progress bars ("Casting the dataset", at every load) unless verbose."""
    if not verbose():
        import datasets

        datasets.disable_progress_bars()


def start_ray(config) -> str:
    """Start Ray (unless already started) and resolve ``trainer.device``.

    Args:
        config: the finalized ``PPOConfig``.

    Returns:
        The device kind the workers use: ``cuda``, ``npu`` or ``cpu`` (``auto``: what Ray's cluster offers).
    """
    import ray

    from easyrl.device import detect_device

    if not ray.is_initialized():
        ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
                 logging_level=logging.INFO if verbose() else logging.WARNING)
    device = config.trainer.device
    if device == "auto":
        device = detect_device(ray.cluster_resources())
    return device
