"""The simulation's verdict and table: per-device peaks by phase beside ``easyrl.sizing.estimate``'s estimate."""

from __future__ import annotations

from typing import Any, Optional

from easyrl.simulate.phases import PhaseResult, Simulation
from easyrl.sizing.estimate import JUDGE, MemoryEstimate, advice


def verdict(sim: Optional[Simulation], estimate: MemoryEstimate, estimate_error: Optional[str]) -> Optional[str]:
    """None when the run fits; else the estimate's error, or every simulated phase whose peak (an experience forward's
    with the actor's AdamW states of a later step: the simulation runs it before any update) and what is held beside
    it exceed the device, with the ``advice`` of the estimate's items for that phase."""
    if estimate_error or sim is None:
        return estimate_error or None
    beside = sum(sim.beside.values())  # the judge's engine, resident in every phase
    held = f" (+ {beside:.1f} GiB held beside it: {', '.join(sim.beside)})" if beside else ""
    problems = []
    for phase in sim.phases:
        peak = phase.peak_gib + estimate.experience.get(phase.name, {}).get("actor Adam states", 0.0)
        if peak + beside <= estimate.capacity_gib:
            continue
        later = " (with the actor's AdamW states of a later step)" if phase.name in estimate.experience else ""
        # the estimate's items for the phase: an experience forward's, the update's, or what stays resident
        items = estimate.experience.get(phase.name, estimate.training if "update" in phase.name else estimate.resident)
        items = items | sim.beside
        problems.append(f"phase '{phase.name}' peaks at {peak:.1f} GiB{held} on a {estimate.capacity_gib:.1f} GiB "
                        f"device{later}: {advice(items, peak + beside - estimate.capacity_gib)}")
    return "; and ".join(problems) or None


def sides(sim: Optional[Simulation], estimate: MemoryEstimate, problems: dict[str, Optional[str]],
          world: int) -> dict[str, dict[str, Any]]:
    """Per side (``trainer``; ``rollout`` when the engines have devices of their own): its devices, its peak GiB per
    device (the estimate's largest phase there, or a simulated phase's with what is held beside it: the simulation
    runs the trainer's phases) and its verdict (``problems[side]``, None: fits)."""
    simulated = [p.peak_gib + sum(sim.beside.values()) for p in sim.phases] if sim is not None else []
    devices = {"trainer": world, "rollout": estimate.rollout_devices}
    return {side: {"devices": devices[side], "fits": problem is None, "problem": problem,
                   "peak_gib": max([sum(items.values()) for items in estimate.phases(side).values()]
                                   + (simulated if side == "trainer" else []))}
            for side, problem in problems.items()}


def overall(problems: dict[str, Optional[str]]) -> Optional[str]:
    """The run's verdict: None when every side fits; a split run names the side of each problem."""
    if len(problems) == 1:
        return problems["trainer"]
    return "; and ".join(f"{side} devices: {problem}" for side, problem in problems.items() if problem) or None


def as_dict(sim: Optional[Simulation], estimate: MemoryEstimate, problems: dict[str, Optional[str]], device: str,
            world: int) -> dict[str, Any]:
    """The ``--json`` output."""
    judge = {"claim_gib": estimate.training[JUDGE], "weights_gib": estimate.judge_weights_gib} \
        if JUDGE in estimate.training else {}
    problem = overall(problems)
    return {"device": device, "capacity_gib": estimate.capacity_gib, "world_size": world,
            "estimate": vars(estimate) | {"rollout_gib": estimate.rollout_gib, "training_gib": estimate.training_gib},
            "simulated": [vars(p) for p in sim.phases] if sim is not None else None,
            "beside": sim.beside if sim is not None else {}, "judge": judge,
            "sides": sides(sim, estimate, problems, world), "fits": problem is None, "problem": problem}


NOT_SEEN = ("not seen: the other ranks (rank 0 runs alone, its collectives meet no peer: run a CPU test with "
            "EASYRL_CHECK_COLLECTIVES=1 for that), vLLM beyond its gpu_memory_utilization share, NPU op coverage "
            "(an NPU is simulated as a fake CUDA device): docs/simulate.md")


def table(sim: Optional[Simulation], estimate: MemoryEstimate, problems: dict[str, Optional[str]], device: str,
          world: int) -> str:
    """A table a person can read (GiB per device)."""
    split = f" trainer + {estimate.rollout_devices} rollout devices" if estimate.rollout_devices else ""
    lines = [f"easyrl simulate: {device} ({estimate.capacity_gib:.1f} GiB) x {world}{split}, GiB per device", ""]
    lines.append(f"{'simulated phase (rank 0)':34} {'peak':>7} {'after':>7} {'seconds':>8} {'estimate':>8}")
    for p in (sim.phases if sim is not None else []):
        after = "" if p.resident_gib != p.resident_gib else f"{p.resident_gib:7.1f}"  # NaN: not measured
        lines.append(f"{p.name:34} {p.peak_gib:7.1f} {after:>7} {p.seconds:8.0f}" + experience_column(p, estimate))
    for name, gib in (sim.beside.items() if sim is not None else []):
        lines.append(f"beside every phase: {name} {gib:.1f} GiB")
    lines += ["", f"{'estimate (easyrl.sizing)':34} {'rollout':>7} {'train':>7}"]
    for name in dict.fromkeys(list(estimate.rollout) + list(estimate.training)):
        lines.append(f"{name:34} {estimate.rollout.get(name, 0.0):7.1f} {estimate.training.get(name, 0.0):7.1f}")
    lines.append(f"{'total':34} {estimate.rollout_gib:7.1f} {estimate.training_gib:7.1f}")
    for name, items in estimate.experience.items():  # easyrl.sizing.experience.estimate_experience
        lines.append(f"experience forward: {name} {sum(items.values()):.1f} GiB (no engine awake; the actor's AdamW "
                     f"states {items.get('actor Adam states', 0.0):.1f} of it)")
    lines.append(f"vLLM weights under TP {estimate.tensor_parallel_size}: {estimate.vllm_weights_gib:.1f} GiB of a "
                 f"{estimate.vllm_claim_gib:.1f} GiB gpu_memory_utilization claim")
    if estimate.host:
        lines.append(f"host memory per node for the offloaded states: {sum(estimate.host.values()):.1f} GiB ("
                     + ", ".join(f"{name} {gib:.1f}" for name, gib in estimate.host.items()) + ")")
    if JUDGE in estimate.training:
        lines.append(f"judge vLLM weights (one engine per device): {estimate.judge_weights_gib:.1f} GiB of a "
                     f"{estimate.training[JUDGE]:.1f} GiB worker.reward.judge.gpu_memory_utilization claim")
    if estimate.rollout_devices:  # each side its own peak and verdict (the rollout column: the engines' devices)
        for side, found in sides(sim, estimate, problems, world).items():
            verdict = "fits" if found["fits"] else "does not fit"
            lines.append(f"{side} devices ({found['devices']}): peak {found['peak_gib']:.1f} GiB: {verdict}")
    problem = overall(problems)
    lines += ["", NOT_SEEN, "fits" if problem is None else f"DOES NOT FIT: {problem}"]
    return "\n".join(lines)


def experience_column(phase: PhaseResult, estimate: MemoryEstimate) -> str:
    """The estimate beside a simulated experience forward, less the actor's AdamW states; empty for other phases."""
    items = estimate.experience.get(phase.name, {})
    return f" {sum(items.values()) - items.get('actor Adam states', 0.0):8.1f}" if items else ""
