"""``easyrl rollouts FOLDER [--step N]`` (also ``python -m easyrl.rollouts``): a table of one step's samples of a
rollout dump (``trainer.rollout_data_dir``; ``easyrl.trainer.rollout_dump``, docs/replay.md)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

from easyrl.errors import run_cli

DESCRIPTION = """\
Print one step's samples of a rollout dump (the folder trainer.rollout_data_dir names), one row each: index, uid,
prompt and response lengths (tokens), reward (the step's score, summed over the response), advantage (its mean over
the response tokens), the weight version that sampled it, and the response's text when a tokenizer is at hand (the
dumped run's model folder, or --tokenizer).

examples:
  {prog} runs/easyrl/cpu_demo/rollouts              the last step
  {prog} runs/easyrl/cpu_demo/rollouts --step 2 --rows 4 --width 60
"""


def main(argv: Optional[list[str]] = None, prog: str = "python -m easyrl.rollouts") -> int:
    """Exit status 0, or 2 for a folder that is no dump or a step it lacks (one ``easyrl: run error:`` line)."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION.format(prog=prog),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="the dump folder (a run's trainer.rollout_data_dir)")
    parser.add_argument("--step", type=int, default=None, help="the training step to show (default: the last)")
    parser.add_argument("--rows", type=int, default=None, help="show the first ROWS samples only (default: all)")
    parser.add_argument("--tokenizer", default=None,
                        help="a tokenizer folder or hub id for the text (default: the dumped run's model, if local)")
    parser.add_argument("--no-text", action="store_true", help="no decoded text")
    parser.add_argument("--width", type=int, default=48, help="characters of text per row (default 48)")
    args = parser.parse_args(argv)
    return run_cli(lambda: _show(args))


def _tokenizer(args: argparse.Namespace, manifest: dict[str, Any]) -> Any:
    """The tokenizer to decode with: ``--tokenizer``, else the dumped run's model folder when it exists here; None
    with ``--no-text`` or when there is none."""
    if args.no_text:
        return None
    path = args.tokenizer
    if path is None:
        model = manifest.get("config", {}).get("worker", {}).get("actor", {}).get("model", {})
        path = model.get("tokenizer_path") or model.get("model_path")
        if not path or not os.path.isdir(path):
            return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def step_rows(batch: Any, tokenizer: Any = None, width: int = 48) -> list[dict[str, Any]]:
    """One dict per sample of a dumped ``batch`` (``easyrl.trainer.rollout_dump.read_step``): ``index``, ``uid``,
    ``prompt`` and ``response`` (lengths in tokens), ``reward`` (``token_level_scores`` summed), ``advantage`` (the
    mean of ``advantages`` over the response mask; None when not dumped), ``version`` (``weight_version``; None when
    unknown) and, with a ``tokenizer``, ``text``: the response decoded without special tokens, cut to ``width``
    characters."""
    response_length = batch["responses"].shape[1]
    prompt_lengths = batch["attention_mask"][:, :-response_length].sum(-1).tolist()
    ends = batch["attention_mask"][:, -response_length:].sum(-1).tolist()  # tool turns included
    mask = batch["response_mask"].float()
    rewards = batch["token_level_scores"].sum(-1).tolist() if "token_level_scores" in batch else [None] * len(batch)
    advantages = ((batch["advantages"] * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist() \
        if "advantages" in batch else [None] * len(batch)
    versions = batch["weight_version"] if "weight_version" in batch else [None] * len(batch)
    uids = batch["uid"] if "uid" in batch else [None] * len(batch)
    rows = []
    for i in range(len(batch)):
        row = {"index": i, "uid": uids[i], "prompt": int(prompt_lengths[i]), "response": int(ends[i]),
               "reward": rewards[i], "advantage": advantages[i], "version": versions[i]}
        if tokenizer is not None:
            text = tokenizer.decode(batch["responses"][i, : ends[i]].tolist(), skip_special_tokens=True)
            text = " ".join(text.split())
            row["text"] = text if len(text) <= width else text[: max(width - 3, 0)] + "..."
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """``rows`` (:func:`step_rows`) as a fixed-width text table with a header line."""
    def cell(value: Any, name: str) -> str:
        if value is None:
            return "-"
        if name == "uid":
            return str(value)[:8]
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    names = list(rows[0]) if rows else ["index", "uid", "prompt", "response", "reward", "advantage", "version"]
    cells = [[cell(row[name], name) for name in names] for row in rows]
    widths = [max([len(name)] + [len(line[j]) for line in cells]) for j, name in enumerate(names)]
    left = {"uid", "text"}

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(w) if n in left else v.rjust(w) for v, w, n in zip(values, widths, names)).rstrip()

    return "\n".join([line(names)] + [line(values) for values in cells])


def _show(args: argparse.Namespace) -> int:
    from easyrl.errors import RunStateError
    from easyrl.trainer.rollout_dump import (MANIFEST, describe_steps, dumped_steps, read_manifest, read_step,
                                             step_file, step_info)

    folder = args.folder
    steps = dumped_steps(folder)
    if args.step is None:
        if not steps:
            read_manifest(folder)  # a folder that does not exist or is no dump: its error
            raise RunStateError(f"the rollout dump {folder} holds no step yet (no step_NNNNNN.parquet file).")
        args.step = steps[-1]
    info = step_info(folder, args.step)
    batch = read_step(folder, args.step)
    if "weight_version" not in batch:  # a colocated step's: derived, in the file's own column
        import pyarrow.parquet as pq

        batch["weight_version"] = pq.read_table(step_file(folder, args.step), columns=["weight_version"]).column(
            "weight_version").to_pylist()
    manifest = read_manifest(folder) if os.path.isfile(os.path.join(folder, MANIFEST)) else {}
    rows = step_rows(batch, _tokenizer(args, manifest), args.width)
    if args.rows is not None:
        rows = rows[: max(args.rows, 0)]
    metrics = info.get("metrics", {})
    summary = ", ".join(f"{name} {metrics[name]:.4g}" for name in ("reward/overall", "actor/pg_loss", "actor/kl_loss")
                        if isinstance(metrics.get(name), (int, float)))
    run = f" of {manifest['run_dir']}" if manifest.get("run_dir") else ""
    print(f"{folder}{run}: steps {describe_steps(steps)}; step {args.step}: {info['samples']} samples"
          f"{', ' + summary if summary else ''}")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
