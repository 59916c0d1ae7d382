"""Validation only (``easyrl eval``, ``trainer.val_only=true``): the trainer's ``Validator`` on ``data.val_files``
over rollout engines that read ``worker.actor.model.model_path`` themselves (no FSDP model, unless a reward model
scores), so the metrics and generations are a training run's validation's; they go to their own folder,
``<run_dir>/eval/<UTC time>``, never into a run folder."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import TYPE_CHECKING, Optional

from easyrl.config import PPOConfig, to_dict
from easyrl.errors import ModelError, RunStateError

if TYPE_CHECKING:
    from easyrl.workers.fsdp_worker import Parts

logger = logging.getLogger("easyrl.eval")


def eval_parts(config: PPOConfig) -> Parts:
    """What the evaluation's workers hold: the engines alone, reading the model folder (``Parts(models=False,
    engine_reads_checkpoint=True)``), unless ``worker.reward.reward_model`` scores the samples: an FSDP role, so the
    workers hold the models too (a frozen actor synced into the engines, as in training)."""
    from easyrl.workers.fsdp_worker import Parts

    if config.worker.reward.reward_model.enabled:
        return Parts()
    return Parts(models=False, engine_reads_checkpoint=True)


def evaluate(config: PPOConfig, step: int = 0, worker_cls: Optional[type] = None) -> tuple[dict[str, float], str]:
    """Validate ``worker.actor.model.model_path`` on ``data.val_files`` at ``step`` (a checkpoint's: it seeds the
    sampling as that step's validation did), on the workers :func:`eval_parts` says; ``worker_cls``: None for
    ``FSDPWorker``, or a subclass. Returns ``(metrics, folder)``: ``metrics`` with the start-up profile
    (``timing_s/startup/*``, seconds); raises ``UserError`` from the pre-flight, before Ray starts."""
    from omegaconf import OmegaConf

    from easyrl.trainer.generation import Generator
    from easyrl.trainer.launch import StartupProfile, quiet_datasets, start_ray
    from easyrl.trainer.loggers import Tracker, check_logger_credentials
    from easyrl.trainer.multi_turn import make_rollout
    from easyrl.trainer.preflight import prepare
    from easyrl.trainer.scoring import ModelRewards, Scorer
    from easyrl.trainer.validation import Validator
    from easyrl.workers.fsdp_worker import FSDPWorker
    from easyrl.workers.group import WorkerGroup

    startup = StartupProfile(time.time())
    config.trainer.val_only = True  # with the models: a frozen actor only (easyrl.workers.roles)
    config.worker.actor.model.lora.rank = 0  # the model is evaluated as given (an exported LoRA actor is merged)
    quiet_datasets()
    ready = prepare(config, train=False)
    startup.add("preflight", time.time() - startup.start)
    check_logger_credentials(config.trainer)
    base = os.path.join(config.trainer.run_dir, "eval", time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    folder, n = base, 1
    while os.path.exists(folder):  # -2, -3, ... when one of that second exists
        n += 1
        folder = f"{base}-{n}"
    os.makedirs(folder)
    OmegaConf.save(OmegaConf.structured(config), os.path.join(folder, "config.yaml"))
    began = time.time()
    device = start_ray(config)
    startup.add("ray", time.time() - began)
    tokenizer = ready.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    scorer = Scorer(config.worker.reward, tokenizer, ready.reward_fn)
    workers = WorkerGroup(config, device, worker_cls=worker_cls or FSDPWorker, parts=eval_parts(config))
    for phase, seconds in workers.startup_seconds.items():
        startup.add(phase, seconds)
    tracker = None
    try:
        rollout = make_rollout(config, workers, tokenizer, pad_id, ready.val_dataset)
        validator = Validator(config, ready.val_dataset, Generator(config, rollout, scorer, pad_id), scorer,
                              tokenizer, ModelRewards.create(config, scorer, workers))
        tracker = Tracker(config.trainer.logger, folder, config.trainer.project_name,
                          f"{config.trainer.experiment_name}-eval", to_dict(config), initial_step=step)
        metrics = validator.run(step)
        startup.add("validation", metrics["timing_s/validation"])
        metrics.update(startup.report({}))
        tracker.log(metrics, step=step, generations=validator.generations)
    finally:
        if tracker is not None:
            tracker.close()
        scorer.close()
        workers.shutdown()
    logger.info("evaluation written to %s", folder)
    return metrics, folder


def is_checkpoint(path: str) -> bool:
    """Whether ``path`` is a ``global_step_N`` folder, its ``actor`` folder or a run's checkpoint folder."""
    from easyrl.trainer.checkpoint import TRACKER

    return (os.path.isfile(os.path.join(path, "actor", ".metadata")) or os.path.isfile(os.path.join(path, ".metadata"))
            or os.path.isfile(os.path.join(path, TRACKER)))


def evaluate_command(argv: list[str], worker_cls: Optional[type] = None) -> dict[str, float]:
    """``easyrl eval``: the config from ``argv`` (``model=PATH`` among them), then :func:`evaluate_model`."""
    from easyrl.config import load_config

    models = [word.split("=", 1)[1] for word in argv if word.startswith("model=")]
    model, words = (models[-1] if models else None), [word for word in argv if not word.startswith("model=")]
    if model is not None:  # before the config's checks, which need a model path (a checkpoint's is set after export)
        words.append(f"worker.actor.model.model_path={model}")
    return evaluate_model(load_config([*words, "trainer.val_only=true"]), model, worker_cls)


def evaluate_model(config: PPOConfig, model: Optional[str] = None,
                   worker_cls: Optional[type] = None) -> dict[str, float]:
    """Validate ``model`` (a Hugging Face folder, or a checkpoint exported to a temporary one; None:
    ``trainer.load_checkpoint_path``, else ``worker.actor.model.model_path``), print the ``val/*`` metrics in one
    line and return them. Raises ``ModelError`` (``model`` missing, or a checkpoint that cannot be exported) or a
    pre-flight ``UserError``."""
    from easyrl.trainer.checkpoint import Checkpointer, export_checkpoint, resolve_checkpoint

    model = model or config.trainer.load_checkpoint_path
    named = model or config.worker.actor.model.model_path  # as the user named it, for the summary line
    if model is not None and not os.path.isdir(model):
        raise ModelError(f"model={model} is not a folder: give a Hugging Face model folder (e.g. a run's "
                         f"huggingface export) or a global_step_N checkpoint")
    step = 0
    with tempfile.TemporaryDirectory(prefix="easyrl-eval-") as tmp:
        if model is not None and is_checkpoint(model):
            try:
                checkpoint = resolve_checkpoint(model)
            except (FileNotFoundError, RunStateError) as err:
                raise ModelError(f"model={model}: {err}") from None
            step = Checkpointer.step_of(checkpoint)
            logger.info("exporting %s to a temporary Hugging Face folder", checkpoint)
            model = export_checkpoint(checkpoint, os.path.join(tmp, "model"))
        if model is not None:
            config.worker.actor.model.model_path = model
            config.worker.actor.model.tokenizer_path = None
        metrics, folder = evaluate(config, step=step, worker_cls=worker_cls)
    shown = ", ".join(f"{key}={value:.4g}" for key, value in metrics.items() if key.startswith("val/"))
    print(f"easyrl eval: {named} at step {step}: {shown} (written to {os.path.join(folder, 'metrics.jsonl')})")
    return metrics
