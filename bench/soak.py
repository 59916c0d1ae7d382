"""Soak: does a long run stay flat? One easyrl run per workload for 100+ steps with checkpoints and validation on,
sampled once per finished step (a new row in ``metrics.jsonl``):

- RSS of the driver (the ``python -m easyrl.trainer`` process) and of every worker (``ray::FSDPWorker`` processes
  among its descendants; Ray's own helpers are summed as ``ray_other``), MB;
- open file descriptors of the driver and the workers;
- ``/dev/shm`` in use (MB; Ray's object store lives there) and the run folder's size on disk (MB: checkpoints,
  metrics, exported model).

    python bench/soak.py run --workload demo --steps 120          # tiny Qwen2.5-VL with images, 2 workers
    python bench/soak.py run --workload smollm2 --steps 100       # SmolLM2-135M-Instruct, 1 worker x 2 threads
    python bench/soak.py images --cache-gb 0                      # vLLM's image cache alone, fresh images
    python bench/soak.py report                                   # table (Markdown) + runs/bench/soak/soak.png

Each run writes ``runs/bench/soak/<workload>/soak.jsonl`` (one row per step). The slope is a least-squares line
through the samples after warm-up (``--warmup`` steps, default 10: the first steps allocate vLLM's caches, the
optimizer state and the first checkpoint), in MB per step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO, "runs", "bench", "soak")
WORKER_NAME = "FSDPWorker"


VAL_ROWS = {"demo": 2, "smollm2": 4}  # the validation set of a soak: the first rows of the workload's own


def val_subset(workload: str, out_dir: str) -> str:
    """A small validation set for the soak (validation on every 10 steps, but over ``VAL_ROWS`` rows, not all):
    the first Geometry3K folders of the demo's sample (symlinked) or the first lines of SmolLM2's ``val.jsonl``.
    Returns its path."""
    path = os.path.join(out_dir, "val")
    shutil.rmtree(path, ignore_errors=True)
    if workload == "demo":
        src = os.path.join(REPO, "examples", "data", "geometry3k_sample")
        os.makedirs(path)
        for name in sorted(n for n in os.listdir(src) if n.isdigit())[:VAL_ROWS[workload]]:
            os.symlink(os.path.join(src, name), os.path.join(path, name))
        return path
    os.makedirs(path)
    with open(os.path.join(REPO, "examples", "data", "digit_addition", "val.jsonl"), encoding="utf-8") as f:
        lines = f.readlines()[:VAL_ROWS[workload]]
    with open(os.path.join(path, "val.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(lines)
    return os.path.join(path, "val.jsonl")


def workload_args(workload: str, steps: int, root: str, val_files: Optional[str] = None) -> list[str]:
    """The command-line words of a workload: checkpoints every 10 steps (newest 2 kept), validation every 10 steps.

    Sized so that 100+ steps fit in ~12 minutes on 2 cores (bench/README.md, "Soak"): 2 prompts a step x n=4
    samples (the configs have 4 and 8 prompts), 16-token responses (48), validation with n=1 over ``val_files``
    (``val_subset``); the demo keeps its images, its 2 workers, its models and every code path (rollout,
    reference, update, weight sync, checkpoint, validation) of a real run.

    Raises:
        ValueError: an unknown workload.
    """
    common = [f"trainer.max_steps={steps}", "trainer.total_epochs=100000", "trainer.save_freq=10",
              "trainer.save_limit=2", "trainer.val_freq=10", "trainer.val_before_train=false",
              f"trainer.runs_root={root}", "trainer.project_name=soak", f"trainer.experiment_name={workload}",
              "trainer.logger=[jsonl]", "data.rollout_batch_size=2", "worker.actor.global_batch_size=2",
              "data.max_response_length=16", "worker.rollout.val_override_config.n=1"]
    if val_files:
        common.append(f"data.val_files={val_files}")
    if workload == "demo":
        from easyrl.testing.tiny import build_tiny_model

        return [f"config={REPO}/examples/configs/cpu_demo.yaml",
                f"worker.actor.model.model_path={build_tiny_model('qwen2_5_vl')}", *common]
    if workload == "smollm2":
        from easyrl.testing.smollm2 import smollm2_path

        return [f"config={REPO}/examples/configs/smollm2_learn.yaml", f"worker.actor.model.model_path={smollm2_path()}",
                "worker.actor.micro_batch_size_per_device_for_update=8", *common]
    raise ValueError(f"unknown workload {workload!r}: choose demo or smollm2")


def _mb(n: float) -> float:
    return round(n / 2**20, 1)


def _dir_size(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def sample(driver: psutil.Process, run_dir: str) -> dict:
    """One sample of the driver's process tree: RSS (MB) and open fds of the driver and each worker, the rest of
    Ray's processes summed, ``/dev/shm`` in use and the run folder's size (MB)."""
    row = {"driver_rss_mb": _mb(driver.memory_info().rss), "driver_fds": driver.num_fds()}
    workers, other = [], 0
    for proc in driver.children(recursive=True):
        try:
            name = " ".join(proc.cmdline()[:1]) or proc.name()
            rss = proc.memory_info().rss
            if WORKER_NAME in name:
                workers.append((proc.pid, rss, proc.num_fds()))
            else:
                other += rss
        except psutil.Error:
            continue
    for rank, (_, rss, fds) in enumerate(sorted(workers)):
        row[f"worker{rank}_rss_mb"] = _mb(rss)
        row[f"worker{rank}_fds"] = fds
    row["ray_other_rss_mb"] = _mb(other)
    row["shm_used_mb"] = _mb(shutil.disk_usage("/dev/shm").used) if os.path.isdir("/dev/shm") else 0.0
    row["run_dir_mb"] = _mb(_dir_size(run_dir))
    return row


def _rows(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if '"timing_s/step"' in line)
    except FileNotFoundError:
        return 0


def _merge(low: dict, peak: dict, row: dict) -> None:
    """Fold one sample into the step's low point and peak of each RSS column."""
    for key, value in row.items():
        if key.endswith("_rss_mb"):
            low[key] = min(low.get(key, value), value)
            peak[key] = max(peak.get(key, value), value)


def _stop_tree(procs: list[psutil.Process]) -> None:
    """Terminate (then kill) the processes this soak started and are still alive: its trainer and that trainer's
    descendants (its own Ray instance), by process, never by name."""
    alive = [p for p in procs if p.is_running()]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=20)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def run(workload: str, steps: int, root: str, extra: list[str], out_dir: Optional[str] = None,
        every_s: float = 0.5) -> str:
    """Train ``workload`` for ``steps`` steps in a child process (its own local Ray instance: ``ray.init()`` with
    no address and no ``RAY_ADDRESS`` starts one), sampling its process tree every ``every_s`` seconds; one row per
    finished step: the sample at the step's end, and for each RSS column the step's low point (``*_rss_mb``: the
    resident baseline between generation and update, what a leak raises) and its peak (``*_rss_peak_mb``).
    Returns the path of ``soak.jsonl``; the trainer's log is ``train.log`` beside it.

    Raises:
        RuntimeError: the run ended with a non-zero exit status.
    """
    run_dir = os.path.join(root, "soak", workload)
    if os.path.isdir(run_dir):
        shutil.rmtree(run_dir)
    out_dir = out_dir or os.path.join(ROOT, workload)
    os.makedirs(out_dir, exist_ok=True)
    out_path = os.path.join(out_dir, "soak.jsonl")
    argv = [sys.executable, "-m", "easyrl.trainer",
            *workload_args(workload, steps, root, val_subset(workload, out_dir)), *extra]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAY_ADDRESS", None)
    start = time.time()
    with open(out_path, "w", encoding="utf-8") as out, open(os.path.join(out_dir, "train.log"), "w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        driver, seen, low, peak, tree = psutil.Process(proc.pid), 0, {}, {}, {}
        try:
            while proc.poll() is None:
                try:
                    tree.update((p.pid, p) for p in driver.children(recursive=True))
                    row = sample(driver, run_dir)
                except psutil.Error:
                    time.sleep(every_s)
                    continue
                _merge(low, peak, row)
                done = _rows(os.path.join(run_dir, "metrics.jsonl"))
                if done > seen:
                    seen = done
                    row.update(low)
                    row.update({k.replace("_rss_mb", "_rss_peak_mb"): v for k, v in peak.items()})
                    row = {"step": done, "elapsed_s": round(time.time() - start, 1), **row}
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(json.dumps(row), flush=True)
                    low, peak = {}, {}
                time.sleep(every_s)
            status = proc.wait()
        finally:
            _stop_tree([driver, *tree.values()])
    if status != 0:
        raise RuntimeError(f"{workload}: the run ended with exit status {status}; see {out_dir}/train.log")
    return out_path


def images(steps: int, per_step: int, cache_gb: Optional[float], side: int = 448) -> str:
    """vLLM's multi-modal processor cache in isolation: one in-process engine (tiny Qwen2.5-VL, as each easyrl worker
    holds one) generates from ``per_step`` fresh random ``side`` x ``side`` images a step, as an RL run sees new images
    every step, and this process's RSS is sampled after each step. ``cache_gb`` None: vLLM's default
    ``mm_processor_cache_gb`` (4 GiB, LRU); 0: what ``easyrl.workers.rollout`` sets. Returns the path of the JSONL.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # as easyrl's CPU workers (workers/group.py)
    import numpy as np
    from PIL import Image
    from vllm import LLM, SamplingParams

    from easyrl.testing.tiny import build_tiny_model

    kwargs = dict(model=str(build_tiny_model("qwen2_5_vl")), dtype="float32", enforce_eager=True, max_model_len=1024,
                  limit_mm_per_prompt={"image": 1, "video": 0}, disable_log_stats=True,
                  mm_processor_kwargs={"min_pixels": 3136, "max_pixels": side * side})
    if cache_gb is not None:
        kwargs["mm_processor_cache_gb"] = cache_gb
    llm = LLM(**kwargs)
    prompt = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
              "<|im_start|>assistant\n")
    rng, me = np.random.default_rng(0), psutil.Process()
    name = "default" if cache_gb is None else f"{cache_gb:g}"
    out_path = os.path.join(ROOT, f"images_cache_{name}", "soak.jsonl")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as out:
        for step in range(1, steps + 1):
            batch = [{"prompt": prompt, "multi_modal_data": {"image": Image.fromarray(
                rng.integers(0, 256, (side, side, 3), dtype=np.uint8))}} for _ in range(per_step)]
            llm.generate(batch, SamplingParams(max_tokens=4, temperature=1.0), use_tqdm=False)
            row = {"step": step, "engine_rss_mb": _mb(me.memory_info().rss)}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)
    return out_path


def slope(steps: list[float], values: list[float]) -> float:
    """Least-squares slope of ``values`` over ``steps`` (units of value per step); 0.0 for fewer than 2 points."""
    n = len(steps)
    if n < 2:
        return 0.0
    mx, my = sum(steps) / n, sum(values) / n
    var = sum((x - mx) ** 2 for x in steps)
    return sum((x - mx) * (y - my) for x, y in zip(steps, values)) / var if var else 0.0


def summarize(path: str, warmup: int = 10) -> dict[str, dict[str, float]]:
    """For each sampled column: first and last value after warm-up and the slope per step after warm-up."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r["step"] > warmup] or rows
    columns = [k for k in rows[0] if k not in ("step", "elapsed_s")]
    out = {}
    for col in columns:
        pts = [(r["step"], r[col]) for r in rows if col in r]
        out[col] = {"first": pts[0][1], "last": pts[-1][1], "slope": slope([p[0] for p in pts], [p[1] for p in pts])}
    out["steps"] = {"first": rows[0]["step"], "last": rows[-1]["step"], "slope": 0.0}
    return out


def report(root: str, warmup: int, plot: Optional[str]) -> None:
    """Print the Markdown table of every ``<root>/<workload>/soak.jsonl`` and draw its columns to ``plot``."""
    paths = {w: os.path.join(root, w, "soak.jsonl") for w in sorted(os.listdir(root))
             if os.path.isfile(os.path.join(root, w, "soak.jsonl"))}
    print(f"| workload | quantity | after step {warmup} | last | slope per step |")
    print("| --- | --- | --- | --- | --- |")
    for workload, path in paths.items():
        for col, s in summarize(path, warmup).items():
            unit = "" if col.endswith("fds") or col == "steps" else " MB"
            print(f"| {workload} | {col} | {s['first']}{unit} | {s['last']}{unit} | {s['slope']:+.3f}{unit} |")
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(paths), 2, figsize=(12, 4 * len(paths)), squeeze=False)
        for (workload, path), (ax_mem, ax_other) in zip(paths.items(), axes):
            with open(path, encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
            steps = [r["step"] for r in rows]
            for col in rows[-1]:
                on_disk = col in ("shm_used_mb", "run_dir_mb")
                target = ax_mem if col.endswith("rss_mb") else ax_other if on_disk else None
                if target is not None:
                    target.plot(steps, [r.get(col) for r in rows], label=col)
            ax_mem.set(title=f"{workload}: RSS", xlabel="step", ylabel="MB")
            ax_other.set(title=f"{workload}: /dev/shm and run folder", xlabel="step", ylabel="MB")
            ax_mem.legend(fontsize=7)
            ax_other.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(plot, dpi=100)
        print(f"plot: {plot}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--workload", choices=("demo", "smollm2"), default="demo")
    r.add_argument("--steps", type=int, default=120)
    r.add_argument("--runs-root", default=os.path.join(REPO, "runs"))
    i = sub.add_parser("images", help="vLLM's multi-modal processor cache alone: fresh images every step")
    i.add_argument("--steps", type=int, default=30)
    i.add_argument("--per-step", type=int, default=16)
    i.add_argument("--cache-gb", type=float, default=None, help="mm_processor_cache_gb (default: vLLM's, 4)")
    p = sub.add_parser("report")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--plot", default=os.path.join(ROOT, "soak.png"))
    args, extra = parser.parse_known_args(argv)
    # `timeout` or a job queue ends a soak with SIGTERM: unwind, so that run() stops the trainer's tree it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.cmd == "run":
        run(args.workload, args.steps, args.runs_root, extra)
    elif args.cmd == "images":
        images(args.steps, args.per_step, args.cache_gb)
    else:
        report(ROOT, args.warmup, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
