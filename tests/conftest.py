"""Shared pytest fixtures (fixtures only)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model_path() -> Callable[[str], Path]:
    """Factory ``tiny_model_path(arch) -> Path`` of a tiny random-weight model (see ``easyrl.models.tiny``).

    Models are built into the shared cache ``$EASYRL_CACHE/tiny_models/<arch>`` (default ``~/.cache/easyrl``), once
    per cache (later sessions reuse them) and at most once per test session.
    """
    from easyrl.models.tiny import build_tiny_model

    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_tiny_model(arch)
        return built[arch]

    return get


@pytest.fixture(scope="session")
def geo3k_sample_dir() -> Path:
    """Folder of the small geometry3k sample shipped in the repo (``examples/data/geometry3k_sample``)."""
    path = REPO_ROOT / "examples" / "data" / "geometry3k_sample"
    if not path.is_dir():
        pytest.fail(f"{path} is missing: it ships with the repository (restore it with git)")
    return path
