"""``easyrl export CHECKPOINT OUT`` (also ``python -m easyrl.export``): a Hugging Face folder from a checkpoint, by
``easyrl.trainer.checkpoint``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional

from easyrl.errors import RunStateError, UserError, run_cli
from easyrl.models.hf_folder import DTYPES
from easyrl.trainer.checkpoint import export_checkpoint

logger = logging.getLogger("easyrl.export")

DESCRIPTION = """\
Write a Hugging Face model folder from a training checkpoint, on one process without Ray.

CHECKPOINT is a global_step_N folder, or a run's checkpoint folder (then its last checkpoint). The actor's sharded
weights are gathered (a LoRA actor merged into plain weights) and written as safetensors in the base model's dtype,
with its config.json, tokenizer/processor files and generation_config.json. OUT is written under a temporary name
and renamed when complete.

example:
  {prog} runs/easyrl/cpu_demo/global_step_2 /tmp/cpu_demo_step2
"""


def main(argv: Optional[list[str]] = None, prog: str = "python -m easyrl.export") -> int:
    """Exit status 0, or 2 for a bad argument or checkpoint."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION.format(prog=prog),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a global_step_N folder, or a run's checkpoint folder (its last one)")
    parser.add_argument("out", help="the Hugging Face folder to write (must not exist)")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help="weights dtype (auto: the base's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
    return run_cli(lambda: _export(args))


def _export(args: argparse.Namespace) -> int:
    if os.path.exists(args.out):
        raise UserError(f"{args.out} exists; give a new folder (an export never overwrites one)", kind="export")
    try:
        out = export_checkpoint(args.checkpoint, args.out, None if args.dtype == "auto" else DTYPES[args.dtype])
    except FileNotFoundError as err:
        raise RunStateError(str(err)) from None
    logger.info("wrote %s", out)
    return 0

if __name__ == "__main__":
    sys.exit(main())
