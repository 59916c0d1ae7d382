"""Step speed (issue #7): one GRPO workload through easyrl, through TRL's ``GRPOTrainer`` and through a bare engine
floor, one after the other in one command, with the ratios.

    python bench/step_speed.py                          # -> runs/bench/step_speed/{summary.json,table.md}
    python bench/step_speed.py --steps 2 --repeats 1 --root /tmp/s data.max_response_length=8   # smallest

The workload (issue #7's): SmolLM2-135M-Instruct, fp32, GRPO, ``data.rollout_batch_size`` = 8 prompts x ``n`` = 4
samples, up to 64 new tokens, KL loss k3 with coefficient 0.04, AdamW lr 1e-5, one optimizer step per rollout batch
(and one forward/backward of all 32 samples: TRL's ``per_device_train_batch_size``), on the digit-addition prompts
of ``examples/configs/smollm2_learn.yaml`` (plus any ``key=value`` overrides, for all three). easyrl runs 1 worker x
all cores (``trainer.cpu_threads_per_worker``), TRL one process with all cores as torch threads, the floor one process
with all cores. Each library trains ``--steps`` steps; its step time is the median
over the steps after the first (which includes warm-up).

The floor is what a plain program spends on the same step, each part measured bare (``floor``, in its own process):
``vllm.LLM.generate`` of the same prompts with the same sampling settings; one forward (log-probs of every token, no
gradient: the reference pass) and one forward + backward + AdamW step on the sequences it generated, unpadded (all
packed into one row, positions restarting per sequence); and a plain ``copy_`` of the model's bytes (what the weight
sync must at least move, in the rollout's dtype). Its step time is the sum of the four (medians of ``--repeats`` after
one warm-up each). The floor computes as the actor does: fp32 weights, ``worker.actor.fsdp.param_dtype`` as the
compute dtype (``torch.autocast`` for bf16, what FSDP2's mixed precision amounts to on one rank) and the actor's
attention (``easyrl.models.packed_attention``: one causal SDPA call per packed sequence), so that the ratio measures
what easyrl adds, not a different kernel choice; vLLM in ``worker.rollout.dtype``.

Ratios are of throughput (prompt + response tokens per second), because sampled responses differ in length from run
to run: ``easyrl / TRL`` (the issue's bar: >= 1.5) and ``floor / easyrl`` (the bar: <= 1.15). Peak RSS is polled
(every 0.2 s, psutil) over each run's process tree: per easyrl worker (``ray::FSDPWorker``), TRL's process, the floor's.
A run folder is never overwritten: ``--root`` must not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning import CONFIG, REPO, command_and_env  # noqa: E402
from plots import read_metrics  # noqa: E402

WORKLOAD = ("data.max_response_length=64", "algorithm.kl_coef=0.04", "worker.actor.optim.lr=1.0e-5",
            "trainer.val_freq=-1", "trainer.val_before_train=false", "trainer.n_gpus_per_node=1",
            "worker.rollout.calculate_log_probs=true",  # easyrl reports its vLLM/actor log-prob gap (rollout/*)
            "worker.actor.micro_batch_size_per_device_for_update=32")  # one forward/backward per step, as TRL's 32
MISMATCH = ("rollout/probs_diff_mean", "rollout/log_prob_diff_max")
PHASES = ("reshard", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor")  # reshard: the weight sync


def overrides(lib: str, root: str, model_path: str, steps: int, threads: int, extra: list[str]) -> list[str]:
    """The config arguments of one library's run: the learning config, the issue's workload (``WORKLOAD``),
    ``steps`` steps, the run folder ``<root>/<lib>``, then ``extra`` (later wins)."""
    return [f"config={CONFIG}", f"worker.actor.model.model_path={model_path}", *WORKLOAD,
            f"trainer.cpu_threads_per_worker={threads}", f"trainer.max_steps={steps}",
            f"trainer.runs_root={os.path.dirname(os.path.abspath(root))}",
            f"trainer.project_name={os.path.basename(os.path.abspath(root))}", f"trainer.experiment_name={lib}", *extra]


def run_watched(command: list[str], env: dict[str, str], interval: float = 0.2) -> dict[str, float]:
    """Run ``command`` to completion while polling the RSS of its process tree; returns the peak RSS (GB) per
    process, named ``main`` (the command itself), by its Ray title (``ray::FSDPWorker#0``, ...) or its executable's
    name; idle Ray workers and processes under 0.2 GB are left out.

    Raises:
        subprocess.CalledProcessError: the command failed.
    """
    import psutil

    proc = subprocess.Popen(command, cwd=REPO, env=env)
    peaks: dict[int, tuple[str, int]] = {}
    done = threading.Event()

    def poll() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                processes = [root, *root.children(recursive=True)]
            except psutil.Error:
                processes = []
            for p in processes:
                try:
                    title = "main" if p.pid == proc.pid else p.name()
                    cmdline = p.cmdline()
                    if cmdline and cmdline[0].startswith("ray::"):  # a Ray worker's title: ray::Class.method
                        title = cmdline[0].split(".")[0]
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                name, peak = peaks.get(p.pid, (title, 0))
                peaks[p.pid] = (title if title != "ray::IDLE" else name, max(peak, rss))
            done.wait(interval)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    code = proc.wait()
    done.set()
    thread.join()
    if code:
        raise subprocess.CalledProcessError(code, command)
    out: dict[str, float] = {}
    for pid, (name, peak) in sorted(peaks.items()):
        if name == "ray::IDLE" or peak < 0.2e9:
            continue
        key = name if name == "main" else f"{name}#{sum(k.startswith(name + '#') for k in out)}"
        out[key] = peak / 1e9
    return out


def summarize(path: str) -> dict[str, float]:
    """Median step time (s) over the steps after the first, median tokens per step and tokens/s, and (easyrl) each
    phase's median share of the step, the weight sync's seconds, the padded-layout fraction and the medians over all
    steps of the vLLM/actor log-prob gap (``MISMATCH``: mean |p_rollout - p_actor| per token, max |logp gap|)."""
    rows = [row for row in read_metrics(path) if "timing_s/step" in row]
    if not rows:
        raise ValueError(f"{path}: no step with timing_s/step")
    timed = rows[1:] or rows
    out = {"steps": len(rows), "median_step_s": statistics.median(r["timing_s/step"] for r in timed)}
    if all("perf/total_num_tokens" in r for r in timed):
        out["tokens_per_step"] = statistics.median(r["perf/total_num_tokens"] for r in timed)
        out["tokens_per_s"] = statistics.median(r["perf/total_num_tokens"] / r["timing_s/step"] for r in timed)
    if "timing_s/gen" in timed[0]:
        for phase in PHASES:
            out[f"share/{phase}"] = statistics.median(r.get(f"timing_s/{phase}", 0.0) / r["timing_s/step"]
                                                      for r in timed)
        out["weight_sync_s"] = statistics.median(r.get("timing_s/reshard", 0.0) for r in timed)
        out["padding_fraction"] = statistics.median(r.get("perf/padding_fraction", float("nan")) for r in timed)
    for key in MISMATCH:  # how exact the step's dtype is: vLLM's sampled-token log-probs vs the actor's
        if all(key in r for r in rows):
            out[key] = statistics.median(r[key] for r in rows)
    return out


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up (allocations, optimizer states, kernel selection)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def floor(config, repeats: int) -> dict[str, float]:
    """The bare engine floor of one step of ``config``'s workload (module docstring), in this process: seconds of
    each part, their sum ``step_s``, the generated sequences' ``tokens_per_step`` and ``tokens_per_s``, and the
    bytes the weight copy moved."""
    import contextlib

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl_grpo import load_prompts
    from vllm import LLM, SamplingParams

    from easyrl.workers.fsdp_model import TORCH_DTYPES
    from easyrl.models.families import attends_in_windows
    from easyrl.workers.policy_forward import attention_implementation

    data, rollout, actor = config.data, config.worker.rollout, config.worker.actor
    model_path = actor.model.model_path
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [tokenizer.encode(row["prompt"], add_special_tokens=False)
               for row in load_prompts(config, data.train_files, tokenizer)[: data.rollout_batch_size]]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(rollout.cpu_kvcache_space_gib))))
    llm = LLM(model=model_path, dtype=TORCH_DTYPES[rollout.dtype], seed=rollout.seed,
              enforce_eager=rollout.enforce_eager, max_model_len=data.max_prompt_length + data.max_response_length,
              enable_prefix_caching=True, disable_log_stats=True)
    params = SamplingParams(n=rollout.n, temperature=rollout.temperature, top_p=rollout.top_p,
                            max_tokens=data.max_response_length)
    outputs: list = []

    def generate() -> None:
        outputs[:] = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)

    out = {"gen_s": _median_time(generate, repeats)}
    sequences = [prompt.prompt_token_ids + list(sample.token_ids) for prompt in outputs for sample in prompt.outputs]
    llm = outputs = None  # the engine's memory is not needed for the rest
    out["tokens_per_step"] = float(sum(len(s) for s in sequences))
    input_ids = torch.tensor([[t for s in sequences for t in s]])
    position_ids = torch.tensor([[p for s in sequences for p in range(len(s))]])
    # fp32 weights; the actor's attention (per-sequence on the CPU) and compute dtype (autocast = FSDP2's bf16 copies)
    attn = attention_implementation("cpu", actor.padding_free, actor.fsdp.param_dtype, flash_available=False,
                                    windowed=attends_in_windows(AutoConfig.from_pretrained(model_path)))
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation=attn)
    compute = TORCH_DTYPES[actor.fsdp.param_dtype]
    autocast = (lambda: torch.autocast("cpu", dtype=compute)) if compute != torch.float32 else contextlib.nullcontext
    optimizer = torch.optim.AdamW(model.parameters(), lr=actor.optim.lr, weight_decay=actor.optim.weight_decay)

    def log_probs() -> torch.Tensor:
        # use_cache=False and no attention mask: transformers reads the sequence boundaries off the position ids
        with autocast():
            logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits[0, :-1]
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[0, 1:, None]).squeeze(-1)

    def forward() -> None:
        with torch.no_grad():
            log_probs()

    def train_step() -> None:
        loss = -log_probs().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), actor.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    out["forward_s"] = _median_time(forward, repeats)
    out["train_step_s"] = _median_time(train_step, repeats)
    unique = {p.data_ptr(): p.detach() for p in model.state_dict().values()}  # tied embeddings: one tensor
    source = list(unique.values())
    target = [torch.empty_like(p, dtype=TORCH_DTYPES[rollout.dtype]) for p in source]  # what vLLM holds

    def copy() -> None:
        for dst, src in zip(target, source):
            dst.copy_(src)

    out["weight_copy_s"] = _median_time(copy, repeats)
    out["weight_bytes"] = float(sum(p.numel() * p.element_size() for p in target))
    out["step_s"] = out["gen_s"] + out["forward_s"] + out["train_step_s"] + out["weight_copy_s"]
    out["tokens_per_s"] = out["tokens_per_step"] / out["step_s"]
    return out


def table(summary: dict[str, Any]) -> str:
    """The Markdown table of ``summary`` (``run``'s result)."""
    e, t, f = summary.get("easyrl"), summary.get("trl"), summary.get("floor")
    lines = ["| run | s/step (median) | tokens/step | tokens/s | phases (share of the step) | peak RSS GB |",
             "| --- | --- | --- | --- | --- | --- |"]
    if e:
        phases = ", ".join(f"{p} {e.get(f'share/{p}', 0):.0%}" for p in PHASES if e.get(f"share/{p}", 0) >= 0.005)
        phases += f"; weight sync {e['weight_sync_s']:.2f} s, padded-layout fraction {e['padding_fraction']:.2f}"
        if all(key in e for key in MISMATCH):
            phases += (f"; vLLM/actor gap: mean prob {e[MISMATCH[0]]:.1e}, max log-prob {e[MISMATCH[1]]:.2f}")
        rss = ", ".join(f"{k} {v:.1f}" for k, v in e["rss_gb"].items())
        lines.append(f"| easyrl | {e['median_step_s']:.2f} | {e['tokens_per_step']:.0f} | {e['tokens_per_s']:.1f} "
                     f"| {phases} | {rss} |")
    if t:
        lines.append(f"| TRL GRPOTrainer | {t['median_step_s']:.2f} | {t.get('tokens_per_step', 0):.0f} "
                     f"| {t.get('tokens_per_s', 0):.1f} | (not timed by phase) | {t['rss_gb'].get('main', 0):.1f} |")
    if f:
        parts = (f"generate {f['gen_s']:.2f} s, forward {f['forward_s']:.2f} s, forward+backward+step "
                 f"{f['train_step_s']:.2f} s, copy of {f['weight_bytes'] / 1e6:.0f} MB {f['weight_copy_s']:.3f} s")
        lines.append(f"| bare floor | {f['step_s']:.2f} | {f['tokens_per_step']:.0f} | {f['tokens_per_s']:.1f} "
                     f"| {parts} | {f['rss_gb'].get('main', 0):.1f} |")
    ratios = summary.get("ratios", {})
    if ratios:
        lines.append("")
        lines.append(", ".join(f"{k} = {v:.2f}" for k, v in ratios.items()))
    return "\n".join(lines)


def ratios(summary: dict[str, Any]) -> dict[str, float]:
    """Throughput and step-time ratios of the runs present in ``summary``."""
    out = {}
    e, t, f = summary.get("easyrl"), summary.get("trl"), summary.get("floor")
    if e and t and t.get("tokens_per_s"):
        out["easyrl/TRL throughput"] = e["tokens_per_s"] / t["tokens_per_s"]
        out["TRL/easyrl s/step"] = t["median_step_s"] / e["median_step_s"]
    if e and f:
        out["floor/easyrl throughput"] = f["tokens_per_s"] / e["tokens_per_s"]
        out["easyrl/floor s/step"] = e["median_step_s"] / f["step_s"]
        if "weight_sync_s" in e:
            out["weight sync / plain copy"] = e["weight_sync_s"] / max(f["weight_copy_s"], 1e-9)
    return out


def run(root: str, steps: int, repeats: int, libs: list[str], extra: list[str],
        model_path: Optional[str] = None) -> dict[str, Any]:
    """Run ``libs`` (of easyrl, trl, floor) one after the other on ``model_path`` (default: SmolLM2-135M-Instruct,
    converted once); writes ``<root>/summary.json`` and ``<root>/table.md`` and returns the summary.

    Raises:
        FileExistsError: ``root`` exists.
    """
    from easyrl.testing.smollm2 import smollm2_path

    if os.path.exists(root):
        raise FileExistsError(f"{root} exists: delete it to run again, or pass another --root")
    os.makedirs(root)
    threads = os.cpu_count() or 1
    model_path = model_path or str(smollm2_path())
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": threads,
                               "model": model_path, "steps": steps}
    for lib in libs:
        args = overrides(lib, root, model_path, steps, threads, extra)
        if lib == "floor":
            out = os.path.join(root, "floor.json")
            command = [sys.executable, os.path.abspath(__file__), "floor", "--out", out, "--repeats", str(repeats),
                       *args]
            env = dict(os.environ, OMP_NUM_THREADS=str(threads), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                       VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"))
            rss = run_watched(command, env)
            with open(out, encoding="utf-8") as f:
                summary[lib] = json.load(f)
        else:
            rss = run_watched(*command_and_env(lib, args))
            summary[lib] = summarize(os.path.join(root, lib, "metrics.jsonl"))
        summary[lib]["rss_gb"] = rss
    summary["ratios"] = ratios(summary)
    with open(os.path.join(root, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    text = table(summary)
    with open(os.path.join(root, "table.md"), "w", encoding="utf-8") as f:
        f.write(f"{summary['date']}, {threads} threads, medians of steps 2..{steps}\n\n{text}\n")
    print(text)
    return summary


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", nargs="?", default="run", help="run (default) or floor (one part, internal)")
    parser.add_argument("--steps", type=int, default=4, help="training steps per library (median over 2..steps)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each floor part")
    parser.add_argument("--libs", nargs="+", default=["easyrl", "trl", "floor"], choices=("easyrl", "trl", "floor"))
    parser.add_argument("--root", default=os.path.join("runs", "bench", "step_speed"))
    parser.add_argument("--model", help="model folder (default: SmolLM2-135M-Instruct, converted once)")
    parser.add_argument("--out", help="floor: the JSON file to write")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides for all three")
    args = parser.parse_intermixed_args(argv)  # options may come after the action and between the overrides
    if args.action not in ("run", "floor"):  # no action given: the first positional is an override
        args.overrides.insert(0, args.action)
        args.action = "run"
    if args.action == "floor":
        import torch

        from easyrl.config import load_config

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
        result = floor(load_config(args.overrides), args.repeats)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        return
    run(args.root, args.steps, args.repeats, args.libs, args.overrides, args.model)


if __name__ == "__main__":
    main()
