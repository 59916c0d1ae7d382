"""``python -m easyrl.trainer config=config.yaml key=value ...``: parse the config, start Ray, build, train.

A mistake in the user's input (``easyrl.errors.UserError``) ends the command with one line on stderr,
``easyrl: <kind> error: <message>``, and exit status 2, without a traceback (``EASYRL_DEBUG=1`` shows it).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Optional

from easyrl.config import PPOConfig, load_config, to_dict
from easyrl.errors import run_cli
from easyrl.quiet import setup_command_logging

logger = logging.getLogger("easyrl")


def build_trainer(config: PPOConfig, worker_cls: Optional[type] = None, startup=None):
    """A ``RayPPOTrainer`` ready to ``fit()``: the pre-flight checks, then Ray and the workers (``worker_cls``: None
    for ``FSDPWorker``, or a subclass), each phase timed into ``startup`` (a ``StartupProfile``; None: a new one).
    Raises a pre-flight ``UserError`` before Ray starts, ``RunFinished`` when the checkpoint is at the last step."""
    from easyrl.trainer.loggers import check_logger_credentials
    from easyrl.trainer.launch import StartupProfile, quiet_datasets, start_ray
    from easyrl.trainer.checkpoint import Checkpointer
    from easyrl.trainer.preflight import prepare
    from easyrl.trainer.rollout_dump import check_dumps
    from easyrl.trainer.run_folder import check_finished, check_resumable, check_run_folder

    startup = startup or StartupProfile(time.time())
    startup.add("launch", time.time() - startup.start)
    quiet_datasets()
    began = time.time()
    check_logger_credentials(config.trainer)
    # refuse another run's folder (or its bad tracker), or a changed config, before any model loads
    resume_from = check_run_folder(config.trainer, to_dict(config))
    ready = prepare(config)
    training_steps = config.training_steps(len(ready.train_dataset))
    check_finished(config.trainer, resume_from, training_steps)
    check_resumable(config)  # a truncated or mismatched checkpoint to resume, before anything starts
    # a dump folder of another run, or a replay's dump that lacks steps or was made otherwise
    check_dumps(config, Checkpointer.step_of(resume_from) if resume_from else 0, training_steps)
    startup.add("preflight", time.time() - began)
    from easyrl.trainer.ray_trainer import RayPPOTrainer  # after the checks, which need none of this
    from easyrl.workers.fsdp_worker import FSDPWorker

    began = time.time()
    device = start_ray(config)
    startup.add("ray", time.time() - began)
    trainer = RayPPOTrainer(config, ready.tokenizer, ready.train_dataset, ready.val_dataset, ready.reward_fn)
    trainer.init_workers(device, worker_cls or FSDPWorker)
    for phase, seconds in trainer.workers.startup_seconds.items():
        startup.add(phase, seconds)
    trainer.startup = startup
    return trainer


USAGE = """\
usage: {prog} [config=FILE.yaml] [KEY=VALUE ...]

Train a policy with RL on Ray + vLLM + FSDP2: GRPO, DAPO, Dr.GRPO, GSPO, CISPO, SAPO, RLOO, REINFORCE++,
ReMax, pass@k (grpo_passk), PPO with a learned critic (gae); full fine-tuning or LoRA.

Configuration, later wins:
  1. the defaults of the dataclasses in easyrl/config/ (one module per section)
  2. the YAML file named by config= (optional, at most one)
  3. dotted KEY=VALUE words on the command line, in order (values are read as YAML)

The documented configuration: config.yaml at the repository root lists every key with what it means;
docs/config.md explains how batch sizes relate, docs/errors.md lists every error message.

Relative paths in the config file (data, reward function, prompt template, model) are found next to the file
first, then in the current folder (docs/config.md).

Running again with the same trainer.experiment_name resumes the run's last checkpoint, if the new config trains the
same way; a change to the model, data, algorithm, batch sizes, lengths, optimizer or seeds is refused naming the keys
(choose a new trainer.experiment_name, or set trainer.resume_mode=force); a finished run says so and exits 0.
trainer.resume_mode (verl's names): auto (default), disable (start afresh), force, resume_path
(trainer.load_checkpoint_path). trainer.val_only=true runs `easyrl eval` instead (validation only).

examples:
  {prog} config=config.yaml worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct
  {prog} config=examples/configs/cpu_demo.yaml worker.actor.model.model_path=PATH trainer.max_steps=1
  bash examples/qwen2_5_vl_7b_geo3k_cispo.sh    (recipes: examples/*.sh, one per algorithm; docs/algorithms.md)

A mistake in the input is reported as one line, 'easyrl: <kind> error: ...', with exit status 2, before any
worker starts where it can be known then; set EASYRL_DEBUG=1 to see its traceback. EASYRL_LOG_LEVEL sets the
log level (default INFO).
"""


def main(argv: Optional[list[str]] = None, prog: str = "python -m easyrl.trainer") -> int:
    """Command-line entry point; returns the exit status: 0 done (or a finished run), 2 after a user error (one
    line), ``128 + signal`` when SIGTERM/SIGINT stopped the run after a checkpoint; a failed run raises (1)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(word in ("-h", "--help", "help") for word in argv):
        print(USAGE.format(prog=prog), end="")
        return 0

    def run() -> int:
        setup_command_logging()  # inside run_cli: a bad EASYRL_LOG_LEVEL / EASYRL_VERBOSE is one line
        config = load_config(argv)  # first: a config mistake is reported before any heavy import
        from easyrl.trainer.run_folder import RunFinished

        if config.trainer.val_only:  # validation only: easyrl eval
            from easyrl.trainer.evaluation import evaluate_model

            evaluate_model(config)
            return 0
        from easyrl.trainer.launch import StartupProfile

        try:
            trainer = build_trainer(config, startup=StartupProfile())  # timed from this process's start
        except RunFinished as done:
            print(f"easyrl: {done}")
            return 0
        trainer.fit()
        trainer.close()  # streams, tools, endpoint, workers' shared memory (a failed run raised above: Ray ends them)
        if trainer.stop_signal is not None:  # stopped by SIGTERM/SIGINT after saving a checkpoint
            return 128 + trainer.stop_signal
        return 0

    return run_cli(run)


if __name__ == "__main__":
    sys.exit(main())
