"""Generate the task of the learning demo: single-digit addition, "What is 3 + 4? Reply with only the number.", "7".

All 100 ordered pairs (a, b) with a, b in 0..9 are used once. The validation split is held out by *unordered* pair:
if "3 + 4" is a validation problem, neither "3 + 4" nor "4 + 3" is a training problem, so a validation success is not
a memorised training answer. No example answer is shown in the prompt (nothing to copy for credit); the reward takes
the last integer of the response (examples/reward_function/last_number.py), whatever surrounds it.
Why this task: the untrained SmolLM2-135M-Instruct answers it correctly in ~29% of samples at temperature 1 (and ~88%
greedily), with 94% of prompts getting both right and wrong samples, so GRPO has successes to amplify; see the probe
in bench/README.md.

Usage: ``python examples/data_preprocess/digit_addition.py --output examples/data/digit_addition`` writes
``train.jsonl`` (80 rows) and ``val.jsonl`` (20 rows); deterministic for a given ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def split_pairs(val_unordered: int, rng: random.Random) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, val) ordered pairs (a, b), a, b in 0..9: ``val_unordered`` random unordered pairs {a, b} go to val
    in both orders (one row when a == b), the rest to train; each list shuffled.

    Raises:
        ValueError: ``val_unordered`` not in 1..54.
    """
    unordered = [(a, b) for a in range(10) for b in range(a, 10)]  # 55
    if not 1 <= val_unordered < len(unordered):
        raise ValueError(f"--val-pairs must be in 1..{len(unordered) - 1}, got {val_unordered}")
    held_out = set(rng.sample(unordered, val_unordered))
    train, val = [], []
    for a in range(10):
        for b in range(10):
            (val if (min(a, b), max(a, b)) in held_out else train).append((a, b))
    rng.shuffle(train)
    rng.shuffle(val)
    return train, val


def row(a: int, b: int) -> dict[str, str]:
    """The dataset row of ``a + b``."""
    return {"problem": f"What is {a} + {b}? Reply with only the number.", "answer": str(a + b)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--val-pairs", type=int, default=11, help="unordered pairs held out for validation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="examples/data/digit_addition")
    args = parser.parse_args(argv)
    train, val = split_pairs(args.val_pairs, random.Random(args.seed))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in (("train", train), ("val", val)):
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for a, b in pairs:
                f.write(json.dumps(row(a, b)) + "\n")
    print(out)


if __name__ == "__main__":
    main()
