"""Probe: the untrained SmolLM2-135M-Instruct's sampled accuracy (temperature 1) on candidate tasks and prompts.

RL can only amplify successes the policy finds, so the learning demo needs a task whose sampled accuracy starts
between ~0.1 and 0.5. Run (under the heavy lock on a shared machine):
``python bench/probe_tasks.py [--prompts 16] [--n 8]``; prints one line per variant: ``strict`` = the whole
response (stripped of spaces and a final period) equals the answer, ``first_int`` / ``last_int`` = the first / last
integer in it does; ``mixed_groups`` = share of prompts whose n samples are neither all right nor all wrong
(last_int), i.e. that give GRPO a gradient.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ONLY = " Reply with only the number."


def make_variants(rng: random.Random, count: int) -> dict[str, list[tuple[str, str]]]:
    """name -> [(user message, answer)]"""
    out: dict[str, list[tuple[str, str]]] = {}
    ks = [rng.randint(10, 98) for _ in range(count)]
    out["next"] = [(f"What number comes right after {k}?{ONLY}", str(k + 1)) for k in ks]
    pairs = [(rng.randint(0, 9), rng.randint(0, 9)) for _ in range(count)]
    out["add1"] = [(f"What is {a} + {b}?{ONLY}", str(a + b)) for a, b in pairs]
    pairs = [(rng.randint(10, 89), rng.randint(1, 9)) for _ in range(count)]
    out["add_2d_1d"] = [(f"What is {a} + {b}?{ONLY}", str(a + b)) for a, b in pairs]
    pairs = [rng.sample(range(10, 100), 2) for _ in range(count)]
    out["max2"] = [(f"Which number is larger, {x} or {y}?", str(max(x, y))) for x, y in pairs]
    out["max2_only"] = [(f"Which number is larger, {x} or {y}?{ONLY}", str(max(x, y))) for x, y in pairs]
    triples = [rng.sample(range(10, 100), 3) for _ in range(count)]
    out["max3"] = [(f"Which is the largest of the numbers {x}, {y}, {z}?{ONLY}", str(max(x, y, z)))
                   for x, y, z in triples]
    lists = [rng.sample(range(1, 10), rng.randint(3, 6)) for _ in range(count)]
    out["count"] = [(f"How many numbers are in this list: {', '.join(map(str, xs))}?{ONLY}", str(len(xs)))
                    for xs in lists]
    return out


def grade(text: str, answer: str) -> tuple[bool, bool, bool]:
    strict = text.strip().rstrip(".").strip() == answer
    ints = re.findall(r"-?\d+", text)
    return strict, bool(ints) and ints[0] == answer, bool(ints) and ints[-1] == answer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--only", default=None, help="comma-separated variant names")
    args = parser.parse_args()
    from vllm import LLM, SamplingParams

    from easyrl.testing.smollm2 import smollm2_path

    llm = LLM(str(smollm2_path()), dtype="float32", enforce_eager=True, max_model_len=512, seed=0)
    tok = llm.get_tokenizer()
    variants = make_variants(random.Random(0), args.prompts)
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only.split(",")}
    # no per-request seed: vLLM-cpu 0.32 fails with "CPU Generator does not use offset"
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens)
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=args.max_tokens)
    for name, rows in variants.items():
        texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
                 for q, _ in rows]
        start = time.time()
        outs = llm.generate(texts, params, use_tqdm=False)
        g_outs = llm.generate(texts, greedy, use_tqdm=False)
        strict = lenient = last = mixed = 0
        for (_, answer), out in zip(rows, outs):
            grades = [grade(c.text, answer) for c in out.outputs]
            strict += sum(g[0] for g in grades)
            lenient += sum(g[1] for g in grades)
            hits = sum(g[2] for g in grades)
            last += hits
            mixed += 0 < hits < args.n
        g_last = sum(grade(o.outputs[0].text, a)[2] for (_, a), o in zip(rows, g_outs)) / len(rows)
        total = len(rows) * args.n
        print(f"{name:10s} sampled strict={strict / total:.3f} first_int={lenient / total:.3f} "
              f"last_int={last / total:.3f} mixed_groups(last_int)={mixed / len(rows):.2f} "
              f"greedy last_int={g_last:.2f} ({time.time() - start:.0f}s)")
        for c in outs[0].outputs[:3]:
            print(f"    {rows[0][1]!r} <- {c.text[:100]!r}")


if __name__ == "__main__":
    main()
