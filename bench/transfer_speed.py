"""The split placement's weight transfer (``easyrl.workers.weight_transfer``), one bucket at a time against two in
flight (device review 2026-12-02, S3-N9), in one command.

Two processes on this machine form the transfer group over gloo, as a trainer's rank 0 and one rollout rank: the
sender gathers and casts each bucket of a model's state (one trainer rank: a copy per tensor) and broadcasts it;
the receiver copies each tensor into a preallocated parameter of its own (what vLLM's load does with a bucket).
The state is a model's shapes read from its ``config.json`` on the meta device (default: the tiny Qwen2.5), filled
with ones. Prints per depth (``TRANSFER_BUCKETS_IN_FLIGHT``) the median seconds of ``--repeats`` transfers and the
ratio to one bucket at a time:

    flock /tmp/easyrl-e2e.lock .venv/bin/python bench/transfer_speed.py --bucket-mb 64

No numbers are asserted anywhere; bench/README.md records the latest ones.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time


def _state(model: str, dtype):
    """``name -> tensor`` of ``model``'s parameters (its shapes, ones in ``dtype``)."""
    import torch
    from transformers import AutoConfig

    from easyrl.sizing.anatomy import meta_model

    shapes = {name: p.shape for name, p in meta_model(AutoConfig.from_pretrained(model)).named_parameters()}
    return {name: torch.ones(shape, dtype=dtype) for name, shape in shapes.items()}


def _member(rank: int, port: int, args, depth: int, out) -> None:
    """One member of the transfer group: ``args.repeats`` transfers at ``depth``; rank 0 puts its seconds on
    ``out``."""
    import torch

    from easyrl.workers import weight_transfer

    torch.set_num_threads(1)
    weight_transfer.TRANSFER_BUCKETS_IN_FLIGHT = depth
    cpu, dtype = torch.device("cpu"), torch.float32
    state = _state(args.model, dtype)
    plan = weight_transfer.make_plan(state, dtype, args.bucket_mb * 2**20)
    group = weight_transfer.open_group("127.0.0.1", port, rank, 2, "cpu", 600)
    seconds = []
    for _ in range(args.repeats + 1):  # the first is a warm-up
        weight_transfer._broadcast(group, torch.zeros(1))  # both sides start together
        start = time.perf_counter()
        if rank == 0:
            weight_transfer.send(group, state, plan, cpu, dtype)
        else:
            for name, tensor in weight_transfer.receive(group, plan, cpu, dtype):
                state[name].copy_(tensor)
        weight_transfer._broadcast(group, torch.zeros(1))
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        out.put((len(plan), statistics.median(seconds[1:])))


def run(args, depth: int) -> tuple[int, float]:
    """``(buckets, median seconds)`` of ``depth`` buckets in flight."""
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    members = [ctx.Process(target=_member, args=(rank, port, args, depth, out)) for rank in (0, 1)]
    for member in members:
        member.start()
    result = out.get(timeout=1800)
    for member in members:
        member.join()
    return result


def main(argv=None) -> None:
    from easyrl.testing.tiny import default_tiny_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_tiny_model_dir("qwen2_5")), help="a folder with config.json")
    parser.add_argument("--bucket-mb", type=int, default=64, help="worker.rollout.update_weights_bucket_megabytes")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = {depth: run(args, depth) for depth in (1, 2)}
    base = results[1][1]
    print("| buckets in flight | buckets | s per transfer | ratio to 1 |\n| --- | ---: | ---: | ---: |")
    for depth, (buckets, seconds) in results.items():
        print(f"| {depth} | {buckets} | {seconds:.3f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()
