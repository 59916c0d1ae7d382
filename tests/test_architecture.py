"""The layering contract of docs/architecture.md, checked by import-linter (``[tool.importlinter]`` in pyproject.toml):
commands > trainer > workers > models, data, rewards, config > core; the runtime never imports ``easyrl.testing``;
no import cycles between the modules of one package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert "Contracts: 3 kept, 0 broken." in report, report  # every contract of pyproject.toml was checked
