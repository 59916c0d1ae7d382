"""bench/gpu_check.py (`make gpu-check`) before it meets the accelerator machine: its toy run on this CPU with only the
packages that machine will have (its image's, and the carried wheels), and the wheels' size beside the working
tree's (the device tool carries at most 64 MiB)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
MUST_BE_ABSENT = {"vllm", "ray", "datasets", "mathruler"}  # modules not on the accelerator machine, not carried
CARRY_LIMIT = 64 * 2**20


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # stdlib imports only at the top
    return module


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _available(roots: set[str]) -> set[str]:
    """``roots`` and everything they require (extras left out), as installed here."""
    dists = {_canonical(d.metadata["Name"]): d for d in md.distributions()}
    seen, todo = set(), [_canonical(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name not in dists:
            continue
        seen.add(name)
        for line in dists[name].requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_canonical(req.name))
    return seen


def _device_site(folder: Path, allowed: set[str]) -> set[str]:
    """A site-packages of links to this environment's, without the distributions outside ``allowed``: what the
    accelerator machine's python3 sees (its image plus the carried wheels). Returns the left-out entries (modules)."""
    site = Path(sysconfig.get_paths()["purelib"])
    owners: dict[str, set[str]] = {}
    for dist in md.distributions(path=[str(site)]):
        name = _canonical(dist.metadata["Name"])
        for line in (dist.read_text("RECORD") or "").splitlines():  # path,hash,size; the first part is the entry
            owners.setdefault(line.split(",", 1)[0].split("/", 1)[0], set()).add(name)
    folder.mkdir()
    dropped = set()
    for entry in os.listdir(site):
        names = owners.get(entry, set())
        if names and not names & allowed:  # an entry of left-out distributions only (namespace folders are shared)
            dropped.add(entry)
            continue
        (folder / entry).symlink_to(site / entry)
    return dropped


# under `make test-slow` (~6 minutes here: its two CPU updates of the 3B-shaped toy take ~40 s each; the suite's time,
# docs/development.md): run it before a `make gpu-check` on a lent device
@pytest.mark.slow
def test_toy_run_with_only_the_accelerator_machines_packages(tmp_path):
    """The whole check at toy size (gloo, the tiny Qwen2.5-VL, bf16), in a Python that sees only the packages of the
    accelerator machine's image and the carried wheels (``python -S`` over a filtered site-packages), its simulation
    subprocess included; every section runs and passes. ~1 minute of CPU (about 40 s on 2 idle cores)."""
    gpu_check = _gpu_check()
    for name, (version, _) in gpu_check.WHEELS.items():
        assert md.version(name) == version, f"{name}: the carried wheel is {version}, this environment has another"
    dropped = _device_site(tmp_path / "site", _available(set(gpu_check.DEVICE_IMAGE) | set(gpu_check.WHEELS)))
    assert MUST_BE_ABSENT <= dropped
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path / "site")]))
    absent = subprocess.run([sys.executable, "-S", "-c", "import ray"], env=env, capture_output=True, text=True)
    assert "No module named 'ray'" in absent.stderr
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-S", str(REPO / "bench" / "gpu_check.py"), "--device", "cpu", "--tiny",
                          "--out", str(out)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["ok"] and not result["errors"], result["errors"]
    phases = {row["name"]: row for row in result["phases"]}
    simulated = [name for name, row in phases.items() if row.get("simulated_gib") is not None]
    assert {"load actor", "old log-probs (forward)", "reference forward", "actor update (fwd+bwd+AdamW)",
            "actor update (offload_params)"} <= phases.keys()
    assert "actor update (fwd+bwd+AdamW)" in simulated and len(simulated) == 8  # every simulated phase paired
    assert phases["old log-probs (forward)"]["estimate_gib"] > 0
    assert 0 < result["parity"]["max_abs"] <= result["parity"]["tolerance"]  # padding on some rows: not the same op
    assert result["dcp"]["ok"] and result["dcp"]["zeroing_changed"] == result["dcp"]["nonzero_tensors"] > 0
    assert result["head"]["ok"] and result["update"]["tokens"] > 0
    assert "packed vs padded" in run.stdout and "DCP round trip" in run.stdout


def test_memory_gate_holds_each_simulated_phase_to_ten_percent():
    """``memory_verdict``: a phase 12% over its simulated peak fails the gate, 8% under passes; the farthest phase is
    named; phases without a device peak (the CPU) or a simulated one are not compared."""
    gpu_check = _gpu_check()
    rows = [{"name": "load actor", "allocated_gib": 3.6, "simulated_gib": 3.9},
            {"name": "actor update (fwd+bwd+AdamW)", "allocated_gib": 30.0, "simulated_gib": 31.0},
            {"name": "actor update (first step)", "allocated_gib": 40.0, "simulated_gib": None}]
    for row in rows:
        row.update(reserved_gib=row["allocated_gib"], seconds=1.0)
    verdict = gpu_check.memory_verdict(rows)
    assert verdict["ok"] and verdict["compared"] == 2 and verdict["worst"] == "load actor"
    rows[1]["allocated_gib"] = 31.0 * 1.12
    verdict = gpu_check.memory_verdict(rows)
    assert not verdict["ok"] and verdict["worst"] == "actor update (fwd+bwd+AdamW)"
    assert abs(verdict["worst_share"] - 0.12) < 1e-9
    assert gpu_check.memory_verdict([{"name": "load actor", "allocated_gib": None, "simulated_gib": 3.9}]) is None
    line = gpu_check.table({"tiny": False, "date": "d", "phases": rows, "errors": {}, "memory": verdict, "ok": False})
    assert "farthest actor update (fwd+bwd+AdamW) (+12.0%): FAILED" in line


def test_carried_wheels_and_working_tree_fit_the_device_tools_limit():
    """The wheels (their recorded sizes, checked against the downloaded files when `make gpu-wheels` has run) plus
    what the device tool sends of this checkout (tracked and untracked-not-ignored files) stay under 64 MiB."""
    gpu_check = _gpu_check()
    wheels = sum(size for _, size in gpu_check.WHEELS.values())
    folder = REPO / ".cache" / "gpu-wheels"
    if folder.is_dir():
        files = {p.name: p.stat().st_size for p in folder.glob("*.whl")}
        assert len(files) == len(gpu_check.WHEELS), f"{folder}: one wheel per WHEELS entry, got {sorted(files)}"
        for name, (version, size) in gpu_check.WHEELS.items():
            stem = f"{name.replace('-', '_')}-{version}-"
            assert [s for f, s in files.items() if f.startswith(stem)] == [size], f"{name} {version}: size differs"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    tree = sum((REPO / p).stat().st_size for p in listed if p and (REPO / p).is_file())
    assert wheels < 4 * 2**20 and tree + wheels < CARRY_LIMIT, (tree, wheels)
    command = gpu_check.download_command("DIR")
    assert "--python-version" in command and command[command.index("--python-version") + 1] == "3.12"
