"""Per-sample sampling seeds, so that a resumed (or re-run) step draws exactly the samples of the original run.

A restarted vLLM engine starts its sampler afresh, and which worker generates which sample depends on the world size;
a seed per request that depends only on the run's seed, the step and the sample's place in the step's batch removes
both dependencies (vLLM's ``SamplingParams.seed``: each request gets its own generator).
"""

from __future__ import annotations

import hashlib

PHASES = ("train", "val", "baseline")


def sample_seed(seed: int, step: int, index: int, round_: int = 0, phase: str = "train") -> int:
    """A 31-bit seed for one request, a hash of ``(seed, phase, step, round_, index)``: ``index`` the sample's place
    in the step's batch, ``round_`` the generation round or validation batch, ``phase`` one of :data:`PHASES`
    (else ValueError)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    key = f"{seed}/{phase}/{step}/{round_}/{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little") & 0x7FFFFFFF


def batch_seeds(seed: int, step: int, size: int, round_: int = 0, phase: str = "train") -> list[int]:
    """``[sample_seed(seed, step, i, round_, phase) for i in range(size)]``."""
    return [sample_seed(seed, step, i, round_, phase) for i in range(size)]
