"""Padded vs padding-free policy passes on one CPU rank: the worker's old-log-prob pass and update, timed.

Each layout runs in its own process (so that peak RSS is its own): an FSDP2 policy (one gloo rank, fp32) scores and
updates the same synthetic batch of left-padded prompts + right-padded responses whose lengths spread like
Geometry3K rollouts (prompt 30-90% and response 10-100% of their maxima). Prints one table row per layout: seconds
for ``compute_log_probs`` and ``update_policy`` (medians of ``--repeats``), the padded-token fraction, and the peak
RSS of the process. Run it under the heavy lock:

    flock /tmp/easyrl-heavy.lock .venv/bin/python bench/padding_free.py --model ~/.cache/easyrl/tiny_models/qwen2_5

No numbers are asserted anywhere; bench/README.md records the latest ones.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

LAYOUTS = {
    "padded, fixed micro-batches": dict(padding_free=False, dynamic_batching=False),
    "padding-free, dynamic batching": dict(padding_free=True, dynamic_batching=True),
}


def _batch(args):
    import torch
    from tensordict import TensorDict

    from easyrl.batch import Batch

    g = torch.Generator().manual_seed(0)
    bsz, plen, rlen = args.batch, args.prompt_len, args.response_len
    ids = torch.zeros(bsz, plen + rlen, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i in range(bsz):
        p = int(plen * (0.3 + 0.6 * torch.rand(1, generator=g).item()))
        r = int(rlen * (0.1 + 0.9 * torch.rand(1, generator=g).item()))
        ids[i, plen - p: plen + r] = torch.randint(10, 5000, (p + r,), generator=g)
        mask[i, plen - p: plen + r] = 1
    resp_mask = mask[:, plen:].clone()
    tensors = TensorDict({"input_ids": ids, "attention_mask": mask, "responses": ids[:, plen:].clone(),
                          "response_mask": resp_mask,
                          "advantages": torch.randn(bsz, rlen, generator=g) * resp_mask}, batch_size=[bsz])
    return Batch(tensors, {"multi_modal_inputs": [{} for _ in range(bsz)]})


def run_layout(args, layout: str) -> dict:
    """In this process: build the policy with ``LAYOUTS[layout]``, time its passes, return the row."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from easyrl.config import ActorConfig
    from easyrl.workers.policy import FSDPPolicy

    torch.set_num_threads(args.threads)
    store = tempfile.mktemp(prefix="easyrl-bench-pg-")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    config = ActorConfig(use_kl_loss=False, **LAYOUTS[layout])
    config.model.model_path = args.model
    config.fsdp.param_dtype = "fp32"
    config.fsdp.enable_gradient_checkpointing = False
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    policy = FSDPPolicy(args.model, config, mesh, "cpu", torch.device("cpu"), trainable=True, offload=config.offload)
    data = _batch(args)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    score_s, update_s = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        data["old_log_probs"] = policy.compute_log_probs(data, args.micro_experience, temperature=1.0)
        score_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        policy.update_policy(data, mini_batch_size=len(data), micro_batch_size=args.micro_update)
        update_s.append(time.perf_counter() - start)
    mask = data["attention_mask"]
    dist.destroy_process_group()
    return {"layout": layout, "old_log_prob_s": statistics.median(score_s), "update_s": statistics.median(update_s),
            "padding_fraction": 1.0 - mask.sum().item() / mask.numel(),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "rss_at_model_gb": rss_before / 2**20}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face causal LM folder")
    parser.add_argument("--batch", type=int, default=16, help="samples (one rank's share of a step)")
    parser.add_argument("--prompt-len", type=int, default=512, help="padded prompt width (data.max_prompt_length)")
    parser.add_argument("--response-len", type=int, default=512, help="padded response width")
    parser.add_argument("--micro-experience", type=int, default=8)
    parser.add_argument("--micro-update", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layout", choices=list(LAYOUTS), help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    if args.layout:
        print(json.dumps(run_layout(args, args.layout)))
        return
    rows = []
    for layout in LAYOUTS:
        out = subprocess.run([sys.executable, __file__, *(argv or sys.argv[1:]), "--layout", layout],
                             check=True, capture_output=True, text=True, env=dict(os.environ))
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]
    print(f"batch {args.batch} x ({args.prompt_len} + {args.response_len}), padded-token fraction "
          f"{base['padding_fraction']:.2f}, {args.threads} threads, medians of {args.repeats}")
    print("| layout | old log-prob s | update s | speed-up (both) | peak RSS GB |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        speedup = (base["old_log_prob_s"] + base["update_s"]) / (row["old_log_prob_s"] + row["update_s"])
        print(f"| {row['layout']} | {row['old_log_prob_s']:.2f} | {row['update_s']:.2f} | {speedup:.2f}x | "
              f"{row['peak_rss_gb']:.2f} |")


if __name__ == "__main__":
    main()
