"""``easyrl eval config=FILE.yaml [model=PATH] [KEY=VALUE ...]`` (also ``python -m easyrl.eval``): the trainer's
validation pass on one model (``easyrl.trainer.evaluation``), writing only ``<run_dir>/eval/<UTC time>``; ``USAGE``
says the rest. ``trainer.val_only=true`` in a training command routes here.
"""

from __future__ import annotations

import sys
from typing import Optional

from easyrl.errors import run_cli

USAGE = """\
usage: {prog} config=FILE.yaml [model=HF_FOLDER|CHECKPOINT] [KEY=VALUE ...]

Validate one model: the trainer's validation pass on data.val_files (same val/* metrics and generations table as
training), with no training data, no checkpoint and no export written.

  model=   a Hugging Face model folder (e.g. runs/easyrl/cpu_demo/huggingface), a global_step_N checkpoint, or a
           run's checkpoint folder (its last checkpoint); default: worker.actor.model.model_path, or
           trainer.load_checkpoint_path when set
  KEY=VALUE  config overrides, as for training (see `easyrl train --help`)

The metrics are printed and written to <runs_root>/<project_name>/<experiment_name>/eval/<UTC time>/metrics.jsonl.
Exit status 0, or 2 after a user error (one line 'easyrl: <kind> error: ...').

example:
  easyrl eval config=examples/configs/cpu_demo.yaml model=runs/easyrl/cpu_demo/huggingface
"""


def main(argv: Optional[list[str]] = None, prog: str = "python -m easyrl.eval") -> int:
    """Exit status 0, or 2 after a user error."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or any(word in ("-h", "--help", "help") for word in argv):
        print(USAGE.format(prog=prog), end="")
        return 0
    from easyrl.quiet import setup_command_logging

    def run() -> int:
        setup_command_logging()  # inside run_cli: a bad EASYRL_LOG_LEVEL / EASYRL_VERBOSE is one line
        from easyrl.trainer.evaluation import evaluate_command

        evaluate_command(argv)
        return 0

    return run_cli(run)


if __name__ == "__main__":
    sys.exit(main())
