"""The ``easyrl`` console script, one command per task::

    easyrl train config=FILE.yaml KEY=VALUE ...   train (same as python -m easyrl.trainer, EasyR1's entry)
    easyrl eval config=FILE.yaml [model=PATH]     validation only (same as python -m easyrl.eval)
    easyrl export CHECKPOINT OUT                  a Hugging Face folder from a checkpoint (python -m easyrl.export)
    easyrl plot RUN_DIR ...                       plot runs' metrics.jsonl (python -m easyrl.plot)
    easyrl simulate config=FILE.yaml [--device D] one step's memory on simulated devices (python -m easyrl.simulate)
    easyrl rollouts FOLDER [--step N]             a table of a rollout dump's step (python -m easyrl.rollouts)
    easyrl check-model PATH|MODEL_TYPE            a family's self-check (python -m easyrl.trainer.selfcheck)
    easyrl --version

Each command's ``--help`` names itself; bare ``easyrl`` prints the help. A new command is one entry of ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

# name -> (the module whose main(argv, prog=...) runs it, its one-line help); the order of `easyrl --help`
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("easyrl.trainer.__main__",
              "train a policy: easyrl train config=FILE.yaml KEY=VALUE ... (same as python -m easyrl.trainer)"),
    "eval": ("easyrl.eval", "validation only: easyrl eval config=FILE.yaml [model=HF_FOLDER|CHECKPOINT] KEY=VALUE ..."),
    "export": ("easyrl.export", "a Hugging Face folder from a checkpoint: easyrl export CHECKPOINT OUT"),
    "plot": ("easyrl.plot", "plot runs' metrics.jsonl to a PNG and an HTML page: easyrl plot RUN_DIR ..."),
    "simulate": ("easyrl.simulate.__main__", "memory and device placement of one step on simulated devices: easyrl "
                 "simulate config=FILE.yaml [--device h100|h200|a100-40|a100-80|910b] [--json]"),
    "rollouts": ("easyrl.rollouts", "a table of one step's samples of a rollout dump (trainer.rollout_data_dir): "
                 "easyrl rollouts FOLDER [--step N]"),
    "check-model": ("easyrl.trainer.selfcheck", "a model family's self-check (its tiny random twin through the parity "
                    "checks, cached): easyrl check-model PATH|MODEL_TYPE [--no-cache] [--json OUT]"),
}


def version() -> str:
    """The installed easyrl's version, ``unknown`` in a checkout that is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("easyrl")
    except PackageNotFoundError:
        return "unknown"


def parser() -> argparse.ArgumentParser:
    """The top-level parser: the commands and ``--version`` (each command parses its own words)."""
    top = argparse.ArgumentParser(prog="easyrl", description="RL post-training for language and vision models "
                                  "(GRPO and its relatives) on Ray + vLLM + FSDP2. `easyrl COMMAND --help` for more.")
    top.add_argument("--version", action="version", version=f"easyrl {version()}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_line) in COMMANDS.items():
        commands.add_parser(name, help=help_line, add_help=False)
    return top


def main(argv: Optional[list[str]] = None) -> int:
    """Dispatch to a command; returns its exit status (bare ``easyrl``: the help, status 0)."""
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else (None, [])
    if command in COMMANDS:
        module, help_line = COMMANDS[command]
        extra = {"description": help_line} if command == "plot" else {}
        return importlib.import_module(module).main(rest, prog=f"easyrl {command}", **extra)
    if command is None:
        parser().print_help()
        return 0
    parser().parse_args(argv)  # --version, --help, or an unknown command (argparse's message, status 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
