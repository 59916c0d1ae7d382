"""``python -m easyrl.trainer config=config.yaml key=value ...``: parse the config, start Ray, build, train.

A mistake in the user's input (``easyrl.errors.UserError``) ends the command with one line on stderr,
``easyrl: <kind> error: <message>``, and exit status 2, without a traceback (``EASYRL_DEBUG=1`` shows it).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

from easyrl.config import PPOConfig, load_config
from easyrl.errors import run_cli
from easyrl.quiet import quiet_libraries, verbose

logger = logging.getLogger("easyrl")


def build_trainer(config: PPOConfig, worker_cls: Optional[type] = None):
    """Check and load the model's tokenizer/processor, the datasets and the reward function
    (``easyrl.trainer.preflight``), then start Ray (unless already started) and the workers (``worker_cls``: None
    for ``FSDPWorker``, or a subclass of it such as the tests' ``easyrl.testing.worker.InspectableWorker``).

    Returns:
        A ``RayPPOTrainer`` ready to ``fit()``.

    Raises:
        UserError: any pre-flight check (model, data, reward; see ``docs/errors.md``), before Ray starts.
    """
    from easyrl.trainer.preflight import prepare
    from easyrl.trainer.run_folder import check_run_folder

    if not verbose():
        import datasets

        datasets.disable_progress_bars()  # "Casting the dataset" bars of every load
    ready = prepare(config)
    check_run_folder(config.trainer)  # refuse another run's folder before anything starts
    import ray  # after the checks, which need none of this

    from easyrl.device import detect_device
    from easyrl.trainer.ray_trainer import RayPPOTrainer
    from easyrl.workers.fsdp_worker import FSDPWorker

    if not ray.is_initialized():
        ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
                 logging_level=logging.INFO if verbose() else logging.WARNING)
    device = config.trainer.device
    if device == "auto":
        device = detect_device(ray.cluster_resources())
    trainer = RayPPOTrainer(config, ready.tokenizer, ready.train_dataset, ready.val_dataset, ready.reward_fn)
    trainer.init_workers(device, worker_cls or FSDPWorker)
    return trainer


USAGE = """\
usage: python -m easyrl.trainer [config=FILE.yaml] [KEY=VALUE ...]

Train a policy with RL on Ray + vLLM + FSDP2: GRPO, DAPO, Dr.GRPO, GSPO, CISPO, SAPO, RLOO, REINFORCE++,
ReMax, pass@k (grpo_passk), PPO with a learned critic (gae); full fine-tuning or LoRA.

Configuration, later wins:
  1. the defaults of the dataclasses in easyrl/config/ (one module per section)
  2. the YAML file named by config= (optional, at most one)
  3. dotted KEY=VALUE words on the command line, in order (values are read as YAML)

The documented configuration: config.yaml at the repository root lists every key with what it means;
docs/config.md explains how batch sizes relate, docs/errors.md lists every error message.

examples:
  python -m easyrl.trainer config=config.yaml worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct
  python -m easyrl.trainer config=examples/configs/cpu_demo.yaml worker.actor.model.model_path=PATH trainer.max_steps=1
  bash examples/qwen2_5_vl_7b_geo3k_cispo.sh    (recipes: examples/*.sh, one per algorithm; docs/algorithms.md)

A mistake in the input is reported as one line, 'easyrl: <kind> error: ...', with exit status 2, before any
worker starts where it can be known then; set EASYRL_DEBUG=1 to see its traceback. EASYRL_LOG_LEVEL sets the
log level (default INFO).
"""


def main(argv: Optional[list[str]] = None) -> int:
    """Command-line entry point; returns the exit status: 0 done; 2 after a user error (a config mistake, a run
    folder that belongs to another run, a reward function failing on a sample with ``on_error: raise``; printed as
    one line, no traceback); ``128 + signal`` when SIGTERM/SIGINT stopped the run after a checkpoint. A failed run
    (e.g. a dead worker) raises, naming the rank and the last good checkpoint (status 1)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(word in ("-h", "--help", "help") for word in argv):
        print(USAGE, end="")
        return 0
    logging.basicConfig(level=os.environ.get("EASYRL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries()

    def run() -> int:
        config = load_config(argv)
        trainer = build_trainer(config)
        trainer.fit()
        trainer.workers.shutdown()  # workers release their shared memory (a failed run raised above: Ray kills them)
        if trainer.stop_signal is not None:  # stopped by SIGTERM/SIGINT after saving a checkpoint
            return 128 + trainer.stop_signal
        return 0

    return run_cli(run)


if __name__ == "__main__":
    sys.exit(main())
