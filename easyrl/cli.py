"""The ``easyrl`` console script: ``easyrl train config=... key=value ...`` and ``easyrl plot RUN_DIR ...``."""

from __future__ import annotations

import argparse
import sys
from typing import Optional


def main(argv: Optional[list[str]] = None) -> int:
    """Dispatch to a subcommand; returns its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="easyrl", description="RL post-training for language and vision models.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("train", help="train: easyrl train config=config.yaml key=value ... "
                                      "(same as python -m easyrl.trainer)", add_help=False)
    from easyrl import plot

    plot.add_arguments(commands.add_parser("plot", help="plot runs' metrics.jsonl to a PNG and an HTML page"))
    if argv[:1] == ["train"]:
        from easyrl.trainer.__main__ import main as train

        return train(argv[1:])
    args = parser.parse_args(argv)
    return plot.run_command(args)


if __name__ == "__main__":
    sys.exit(main())
