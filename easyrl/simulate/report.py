"""The simulation's table: per-device peak memory by phase beside ``easyrl.workers.memory_estimate``'s estimate,
and the verdict (fits, or the phase that does not and the setting to change)."""

from __future__ import annotations

import json
from typing import Any, Optional

from easyrl.simulate.phases import PhaseResult, Simulation
from easyrl.workers.memory_estimate import EXPERIENCE_SETTINGS, MemoryEstimate


def verdict(sim: Optional[Simulation], estimate: MemoryEstimate, estimate_error: Optional[str]) -> Optional[str]:
    """None when the run fits; else why not (the estimate's error naming the setting, or the simulated phase whose
    peak exceeds the device)."""
    if estimate_error:
        return estimate_error
    if sim is not None:
        beside = sum(sim.beside.values())  # the judge's engine, resident in every phase
        for phase in sim.phases:
            if phase.name in estimate.experience:  # an experience forward: name the setting that sizes it
                problem = experience_problem(phase, beside, estimate)
                if problem:
                    return problem
            if phase.peak_gib + beside > estimate.capacity_gib:
                held = f" (+ {beside:.1f} GiB held beside it: {', '.join(sim.beside)})" if beside else ""
                return (f"phase '{phase.name}' peaks at {phase.peak_gib:.1f} GiB{held} on a "
                        f"{estimate.capacity_gib:.1f} GiB device: set worker.actor.offload.offload_params=true, lower "
                        "worker.actor.micro_batch_size_per_device_for_experience / max_token_len_per_device, or use "
                        "more devices (trainer.n_gpus_per_node / trainer.nnodes)")
    return None


def simulated_experience_gib(phase: PhaseResult, estimate: MemoryEstimate) -> float:
    """An experience forward's simulated peak as the device holds it from the second step on: the simulation runs
    it before any update, so the actor's AdamW states (resident then unless ``offload_optimizer`` / offloaded) are
    added from the estimate."""
    return phase.peak_gib + estimate.experience.get(phase.name, {}).get("actor Adam states", 0.0)


def experience_problem(phase: PhaseResult, beside: float, estimate: MemoryEstimate) -> Optional[str]:
    """None when the experience forward ``phase`` fits (:func:`simulated_experience_gib` + what is held beside it);
    else the phase, the numbers and the setting that sizes its micro-batch (``memory_estimate.EXPERIENCE_SETTINGS``)."""
    peak = simulated_experience_gib(phase, estimate)
    if peak + beside <= estimate.capacity_gib:
        return None
    held = f" (+ {beside:.1f} GiB held beside it)" if beside else ""
    return (f"phase '{phase.name}' peaks at {peak:.1f} GiB{held} on a {estimate.capacity_gib:.1f} GiB device (with "
            f"the actor's AdamW states of a later step): lower {EXPERIENCE_SETTINGS[phase.name]}, offload the "
            "resident models (worker.actor.offload.offload_params=true, worker.ref.offload.offload_params=true), or "
            "use more devices (trainer.n_gpus_per_node / trainer.nnodes)")


def judge_problem(judge: dict[str, float]) -> Optional[str]:
    """None without a judge or when its weights fit in its claim (``extra_roles.judge_engine``); else why not."""
    if judge and judge["weights_gib"] >= judge["claim_gib"]:
        return (f"judge phase: the judge's vLLM weights ({judge['weights_gib']:.1f} GiB in worker.rollout.dtype) do "
                f"not fit in its share, worker.reward.judge.gpu_memory_utilization x the device = "
                f"{judge['claim_gib']:.1f} GiB, leaving no KV cache: raise worker.reward.judge.gpu_memory_utilization "
                "(and lower worker.rollout.gpu_memory_utilization), or choose a smaller judge model")
    return None


def as_dict(sim: Optional[Simulation], estimate: MemoryEstimate, problem: Optional[str], device: str,
            world: int) -> dict[str, Any]:
    """The ``--json`` output."""
    return {"device": device, "capacity_gib": estimate.capacity_gib, "world_size": world,
            "estimate": {"rollout": estimate.rollout, "training": estimate.training,
                         "experience": estimate.experience,
                         "rollout_gib": estimate.rollout_gib, "training_gib": estimate.training_gib,
                         "vllm_weights_gib": estimate.vllm_weights_gib,
                         "tensor_parallel_size": estimate.tensor_parallel_size},
            "simulated": [vars(p) for p in sim.phases] if sim is not None else None,
            "beside": sim.beside if sim is not None else {},
            "fits": problem is None, "problem": problem}


def table(sim: Optional[Simulation], estimate: MemoryEstimate, problem: Optional[str], device: str,
          world: int, judge: Optional[dict[str, float]] = None) -> str:
    """A table a person can read (GiB per device)."""
    lines = [f"easyrl simulate: {device} ({estimate.capacity_gib:.1f} GiB) x {world}, GiB per device", ""]
    lines.append(f"{'simulated phase (rank 0)':34} {'peak':>7} {'after':>7} {'seconds':>8} {'estimate':>8}")
    for p in (sim.phases if sim is not None else []):
        after = "" if p.resident_gib != p.resident_gib else f"{p.resident_gib:7.1f}"  # NaN: not measured
        lines.append(f"{p.name:34} {p.peak_gib:7.1f} {after:>7} {p.seconds:8.0f}" + experience_column(p, estimate))
    for name, gib in (sim.beside.items() if sim is not None else []):
        lines.append(f"beside every phase: {name} {gib:.1f} GiB")
    lines += ["", f"{'estimate (memory_estimate.py)':34} {'rollout':>7} {'train':>7}"]
    for name in dict.fromkeys(list(estimate.rollout) + list(estimate.training)):
        lines.append(f"{name:34} {estimate.rollout.get(name, 0.0):7.1f} {estimate.training.get(name, 0.0):7.1f}")
    lines.append(f"{'total':34} {estimate.rollout_gib:7.1f} {estimate.training_gib:7.1f}")
    for name, items in estimate.experience.items():  # experience_estimate.estimate_experience
        lines.append(f"experience forward: {name} {sum(items.values()):.1f} GiB (vLLM asleep; the actor's AdamW states "
                     f"{items.get('actor Adam states', 0.0):.1f} of it)")
    lines.append(f"vLLM weights under TP {estimate.tensor_parallel_size}: {estimate.vllm_weights_gib:.1f} GiB of a "
                 f"{estimate.vllm_claim_gib:.1f} GiB gpu_memory_utilization claim")
    if judge:
        lines.append(f"judge vLLM weights (one engine per device): {judge['weights_gib']:.1f} GiB of a "
                     f"{judge['claim_gib']:.1f} GiB worker.reward.judge.gpu_memory_utilization claim")
    lines += ["", "fits" if problem is None else f"DOES NOT FIT: {problem}"]
    return "\n".join(lines)


def experience_column(phase: PhaseResult, estimate: MemoryEstimate) -> str:
    """The estimate beside a simulated experience forward (``experience_estimate.estimate_experience``), less the
    actor's AdamW states, which the simulation (before any update) does not hold yet; empty for other phases."""
    items = estimate.experience.get(phase.name)
    if items is None:
        return ""
    return f" {sum(items.values()) - items.get('actor Adam states', 0.0):8.1f}"


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2)
