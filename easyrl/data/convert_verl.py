"""``python -m easyrl.data.convert_verl IN OUT``: a verl-format parquet file (``prompt`` chat messages,
``reward_model.ground_truth``, optional ``images``, ``data_source``) -> easyrl's ``problem``, ``answer`` (a string, JSON
for a non-string), ``images``, ``data_source`` (docs/data.md). A system message shared by every row is printed as the
``data.system_prompt`` to set; different system messages or multi-turn prompts are refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from easyrl.errors import DataError, run_cli

VERL_COLUMNS = ("prompt", "reward_model")


def convert(src: str, dst: str) -> Optional[str]:
    """Write ``dst`` from ``src``; returns the system message all rows share, or None. DataError for an unreadable
    ``src``, missing verl columns (naming those it has), a bad row, or different system messages."""
    import datasets

    try:
        rows = datasets.load_dataset("parquet", data_files=src, split="train")
    except Exception as err:
        raise DataError(f"cannot read {src!r} as parquet: {type(err).__name__}: {err}") from None
    missing = [c for c in VERL_COLUMNS if c not in rows.column_names]
    if missing:
        raise DataError(f"{src!r} has no column(s) {missing} of verl's format; its columns are {rows.column_names}")
    systems: set[Optional[str]] = set()
    converted: dict[str, list] = {"problem": [], "answer": []}
    for index, row in enumerate(rows.select_columns(list(VERL_COLUMNS))):  # a single-turn [system,] user prompt
        messages = row["prompt"]
        if isinstance(messages, str):  # some verl datasets store the chat as a JSON string
            messages = json.loads(messages)
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise DataError(f"row {index}: column 'prompt' must be a list of {{'role', 'content'}} messages, got "
                            f"{type(messages).__name__}")
        roles = [m["role"] for m in messages]
        if roles not in (["user"], ["system", "user"]):
            raise DataError(f"row {index}: the prompt's roles are {roles}; only a single-turn prompt ([system,] user) "
                            "can be converted")
        ground_truth = (row["reward_model"] or {}).get("ground_truth")
        if ground_truth is None:
            raise DataError(f"row {index}: column 'reward_model' has no 'ground_truth'")
        systems.add(messages[0]["content"] if roles[0] == "system" else None)
        converted["problem"].append(messages[-1]["content"])
        converted["answer"].append(ground_truth if isinstance(ground_truth, str) else json.dumps(ground_truth))
    if len(systems) > 1:
        raise DataError(f"{src!r}: the rows have {len(systems)} different system messages; data.system_prompt is one "
                        "text for all rows (convert the groups separately)")
    kept = [c for c in ("images", "data_source") if c in rows.column_names]
    out = rows.select_columns(kept)
    for key, values in converted.items():
        out = out.add_column(key, values)
    out.select_columns(["problem", "answer"] + kept).to_parquet(dst)
    return next(iter(systems))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m easyrl.data.convert_verl",
                                     description="Convert a verl-format parquet file to easyrl's columns "
                                                 "(problem, answer, images, data_source); see docs/data.md.")
    parser.add_argument("src", metavar="IN", help="verl parquet file (prompt, reward_model, [images, data_source])")
    parser.add_argument("dst", metavar="OUT", help="easyrl parquet file to write")
    args = parser.parse_args(argv)

    def run() -> int:
        import datasets

        datasets.disable_progress_bars()
        system = convert(args.src, args.dst)
        import pyarrow.parquet as pq

        images = "images" in pq.read_schema(args.dst).names
        print(f"wrote {args.dst}: data.train_files={args.dst} (columns problem, answer{', images' if images else ''})")
        if system is not None:
            print(f"every prompt had this system message; put it in your config YAML's data section: "
                  f"system_prompt: {json.dumps(system)}")
        return 0

    return run_cli(run)


if __name__ == "__main__":
    sys.exit(main())
