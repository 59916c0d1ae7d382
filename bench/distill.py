"""On-policy distillation learns: SmolLM2-135M-Instruct teaches a smaller student with its tokenizer (by default
SmolLM2 with 6 of its 30 layers, 49.6M parameters, ``easyrl.testing.smollm2.smollm2_layer_dropped_path``; or
``--student random``, the 6.6M random-weight ``easyrl.testing.tiny.build_tiny_smollm2_student``) on the digit-addition
prompts, pure distillation (``algorithm.adv_estimator=on_policy_distill``: the advantage of each sampled token is
``-(log pi_student - log pi_teacher)``), and the reverse KL to the teacher on the 20 HELD-OUT prompts of
``examples/data/digit_addition/val.jsonl`` is measured before training and every ``--eval-every`` steps.

    python bench/distill.py                                # ~6 min on 2 cores (--budget-s); runs/bench/distill/
    python bench/distill.py report                         # table (Markdown) + distill.png from the saved JSON

The held-out measure: each held-out prompt sampled ``--eval-n`` times by the student's vLLM engine at temperature 1
(fixed sampling seeds), the student's (actor's) and the teacher's log-probs of those tokens from the workers, and the
mean of ``log pi_student - log pi_teacher`` over all response tokens (nats per token): the same estimate as the
training metric ``distill/reverse_kl``, on prompts the student never trains on. Run it under the machine-wide e2e lock
(``flock /tmp/easyrl-e2e.lock python bench/distill.py``): it starts Ray and vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO, "runs", "bench", "distill")


def config_words(args: argparse.Namespace, root: str, student: str, teacher: str) -> list[str]:
    data = os.path.join(REPO, "examples", "data", "digit_addition")
    return [
        f"config={os.path.join(REPO, 'examples', 'configs', 'smollm2_learn.yaml')}",
        f"worker.actor.model.model_path={student}", f"worker.teacher.model.model_path={teacher}",
        "algorithm.adv_estimator=on_policy_distill", "algorithm.disable_kl=true", "algorithm.use_kl_loss=false",
        f"data.train_files={os.path.join(data, 'train.jsonl')}", f"data.val_files={os.path.join(data, 'val.jsonl')}",
        f"data.max_response_length={args.response_length}", f"data.rollout_batch_size={args.batch}",
        f"worker.actor.global_batch_size={args.batch}", f"worker.rollout.n={args.n}",
        f"worker.actor.optim.lr={args.lr}", "worker.actor.micro_batch_size_per_device_for_update=32",
        f"trainer.max_steps={args.steps}", "trainer.total_epochs=100", "trainer.val_before_train=false",
        "trainer.val_freq=-1", f"trainer.runs_root={root}", "trainer.experiment_name=distill",
    ]


def held_out_reverse_kl(trainer, step: int, n: int, samples: Optional[list] = None) -> float:
    """Mean ``log pi_student - log pi_teacher`` over the response tokens of ``n`` samples (temperature 1) of every
    held-out prompt, with the student's current weights (see the module docstring); the first two responses are
    appended, decoded, to ``samples``."""
    import torch
    from torch.utils.data import DataLoader

    from easyrl.algorithms.distillation import reverse_kl_metrics, token_reverse_kl
    from easyrl.data.dataset import collate_fn
    from easyrl.trainer.rollout import for_workers
    from easyrl.workers.fsdp_worker import FSDPWorker

    dataset = trainer.val_dataset
    features = next(iter(DataLoader(dataset, batch_size=len(dataset), shuffle=False, collate_fn=collate_fn)))
    prompts = trainer.generator.prompt_batch(features, n, 0, phase="val")  # the same seeds at every measurement
    batch = trainer.generator.generate_even(prompts, overrides={"temperature": 1.0})
    workers = trainer.workers
    student = torch.cat(workers.run_split(FSDPWorker.compute_log_probs, for_workers(batch)), dim=0)
    teacher = torch.cat(workers.run_split(FSDPWorker.compute_teacher_log_probs, for_workers(batch)), dim=0)
    kl = token_reverse_kl(student, teacher, batch["response_mask"])
    if samples is not None:
        for row, mask in zip(batch["responses"][:2], batch["response_mask"][:2]):
            samples.append({"step": step, "response": trainer.tokenizer.decode(row[mask.bool()].tolist())})
    return reverse_kl_metrics(kl, batch["response_mask"])["distill/reverse_kl"]


def run(args: argparse.Namespace) -> dict:
    """Train ``args.steps`` steps, measuring the held-out reverse KL every ``args.eval_every`` steps; writes and
    returns ``<root>/distill.json``."""
    import ray

    from easyrl.config import load_config
    from easyrl.testing.smollm2 import smollm2_path
    from easyrl.testing.tiny import build_tiny_smollm2_student
    from easyrl.trainer.__main__ import build_trainer

    os.makedirs(args.root, exist_ok=True)
    if args.student == "random":
        student = build_tiny_smollm2_student()
    else:
        from easyrl.testing.smollm2 import smollm2_layer_dropped_path

        student = smollm2_layer_dropped_path()
    config = load_config(config_words(args, args.root, str(student), str(smollm2_path())))
    ray.init(num_cpus=2, include_dashboard=False)
    result: dict = {"settings": {k: v for k, v in vars(args).items() if k != "command"}, "train": [], "held_out": [],
                    "samples": []}
    start = time.time()
    try:
        trainer = build_trainer(config)
        stream = trainer.prompt_stream()
        result["held_out"].append({"step": 0, "reverse_kl": held_out_reverse_kl(trainer, 0, args.eval_n,
                                                                                    result["samples"])})
        print(f"step 0: held-out reverse KL {result['held_out'][-1]['reverse_kl']:.3f}", flush=True)
        for step in range(1, args.steps + 1):
            trainer.global_step = step
            metrics = trainer.train_step(stream)
            result["train"].append({"step": step, "reverse_kl": metrics["distill/reverse_kl"],
                                    "step_s": metrics["timing_s/step"], "teacher_s": metrics["timing_s/teacher"],
                                    "response_length": metrics["response_length/mean"]})
            line = f"step {step}: train reverse KL {metrics['distill/reverse_kl']:.3f}"
            last = step == args.steps or (args.budget_s and time.time() - start > args.budget_s)
            if step % args.eval_every == 0 or last:
                result["held_out"].append({"step": step, "reverse_kl": held_out_reverse_kl(trainer, step, args.eval_n,
                                                                                           result["samples"])})
                line += f", held-out {result['held_out'][-1]['reverse_kl']:.3f}"
            print(f"{line} ({time.time() - start:.0f} s)", flush=True)
            result["wall_s"] = time.time() - start
            _save(result, args.root)  # after every step: a run stopped by a time limit keeps what it measured
            if args.budget_s and time.time() - start > args.budget_s:
                print(f"stopping after step {step}: --budget-s {args.budget_s} s spent", flush=True)
                break
        trainer.close()
    finally:
        ray.shutdown()
    result["wall_s"] = time.time() - start
    _save(result, args.root)
    return result


def _save(result: dict, root: str) -> None:
    with open(os.path.join(root, "distill.json"), "w") as f:
        json.dump(result, f, indent=1)


def report(root: str) -> str:
    """The Markdown table of ``<root>/distill.json`` and its curve ``<root>/distill.png``; returns the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(root, "distill.json")) as f:
        result = json.load(f)
    held, train = result["held_out"], result["train"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot([r["step"] for r in train], [r["reverse_kl"] for r in train], label="training samples", alpha=0.6)
    ax.plot([r["step"] for r in held], [r["reverse_kl"] for r in held], "o-", label="held-out prompts")
    ax.set_xlabel("step")
    ax.set_ylabel("reverse KL to the teacher (nats / token)")
    kind = result["settings"].get("student", "random")
    student = {"layers": "6-layer SmolLM2 (49.6M)", "random": "random 6.6M"}[kind]
    ax.set_title(f"SmolLM2-135M-Instruct teaching a {student}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(root, "distill.png"), dpi=100)
    first, last = held[0]["reverse_kl"], held[-1]["reverse_kl"]
    rows = ["| step | held-out reverse KL (nats/token) | training reverse KL |", "| --- | --- | --- |"]
    by_step = {r["step"]: r["reverse_kl"] for r in train}
    for r in held:
        rows.append(f"| {r['step']} | {r['reverse_kl']:.3f} | {by_step.get(r['step'], float('nan')):.3f} |")
    step_s = sum(r["step_s"] for r in train) / max(len(train), 1)
    rows.append(f"\nHeld-out reverse KL {first:.3f} -> {last:.3f} ({last / first:.2f}x) in {len(train)} steps, "
                f"{result['wall_s']:.0f} s wall ({step_s:.1f} s per step).")
    return "\n".join(rows)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="run", choices=("run", "report"))
    parser.add_argument("--student", choices=("layers", "random"), default="layers",
                        help="layers: SmolLM2 with 6 of its 30 layers (49.6M, easyrl.testing.smollm2); random: the "
                        "tiny random-weight Llama with its tokenizer (6.6M, easyrl.testing.tiny)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=8, help="prompts per step (one optimizer step)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--eval-n", type=int, default=2, help="samples per held-out prompt")
    parser.add_argument("--root", default=ROOT)
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="stop after the step that passes this many seconds (held-out measured once more); 0: none")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    print(report(args.root))


if __name__ == "__main__":
    sys.exit(main())
